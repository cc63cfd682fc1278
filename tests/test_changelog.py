"""Copies of a store partition follow its changelog: whole batches, fenced by writer epoch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, Producer

from foldstream.broker import KafkaCluster
from foldstream.changelog import (
    BATCH_END_HEADER,
    BATCH_START_HEADER,
    EPOCH_HEADER,
    FOLDED_FROM_HEADER,
    SOURCE_OFFSET_HEADER,
    StandbyReplicas,
    StoreLayout,
    open_copy,
    restore,
)
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from foldstream.state import RocksDBWriter

Record = tuple[int, int, bytes, bytes, str] | tuple[int, int, bytes, bytes, str, int]
"""(writer epoch, source offset, key, value, marks: "<" opens its batch, ">" closes it[, the
source offset its writer folded from: records of writers before that header lack it])"""


def _send(bootstrap: str, topic: str, records: list[Record]) -> None:
    producer = Producer(producer_config(bootstrap))
    for epoch, source_offset, key, value, marks, *folded_from in records:
        headers = [
            (SOURCE_OFFSET_HEADER, str(source_offset).encode()),
            (EPOCH_HEADER, str(epoch).encode()),
        ]
        if folded_from:
            headers.append((FOLDED_FROM_HEADER, str(folded_from[0]).encode()))
        if "<" in marks:
            headers.append((BATCH_START_HEADER, b"1"))
        if ">" in marks:
            headers.append((BATCH_END_HEADER, b"1"))
        producer.produce(topic, key=key, value=value, partition=0, headers=headers)
    assert producer.flush(30) == 0


def _copy(state_dir: Path, layout: StoreLayout) -> tuple[dict[bytes, bytes | None], int | None]:
    writer = open_copy(state_dir, "s", layout, 0)
    try:
        values = {key: writer.get(key) for key in (b"a", b"b", b"c")}
        return values, writer.applied_offset()
    finally:
        writer.close()


def _layout(broker: KafkaCluster, name: str) -> StoreLayout:
    """A store layout whose (one-partition, compacted) changelog topic exists."""
    layout = StoreLayout(f"{name}.events", f"{name}.changelog")
    ensure_topics(broker.bootstrap, [TopicSpec(layout.changelog_topic, 1, compact=True)])
    return layout


def _position(state_dir: Path, layout: StoreLayout) -> tuple[int | None, int]:
    """The copy's changelog offset and newest epoch seen."""
    writer = open_copy(state_dir, "s", layout, 0)
    try:
        return writer.changelog_offset(), writer.changelog_epoch()
    finally:
        writer.close()


def _restore(bootstrap: str, state_dir: Path, layout: StoreLayout) -> int:
    return restore(bootstrap=bootstrap, state_dir=state_dir, store="s", layout=layout, partition=0)


def test_a_previous_owners_late_writes_are_ignored(broker: KafkaCluster, tmp_path: Path) -> None:
    layout = _layout(broker, "fence")
    _send(
        broker.bootstrap,
        layout.changelog_topic,
        [
            (1, 10, b"a", b"a@10", "<"),
            (1, 10, b"b", b"b@10", ">"),
            (1, 20, b"a", b"a@20", "<"),  # the owner pauses mid-batch; a new owner takes over
            (2, 25, b"a", b"a@25", "<"),  # ...restored to source offset 10, it folds on
            (2, 25, b"c", b"c@25", ">"),
        ],
    )
    # A copy that follows in two steps keeps the newest epoch it has seen in between.
    assert _restore(broker.bootstrap, tmp_path, layout) == 4
    assert _copy(tmp_path, layout) == ({b"a": b"a@25", b"b": b"b@10", b"c": b"c@25"}, 25)
    _send(
        broker.bootstrap,
        layout.changelog_topic,
        [
            (1, 20, b"b", b"b@20", ">"),  # the old owner wakes up and closes its batch
            (1, 30, b"b", b"b@30", "<>"),  # and writes one more before it learns it lost
            (2, 40, b"b", b"b@40", "<"),
            (2, 40, b"c", b"c@40", ">"),
        ],
    )
    assert _restore(broker.bootstrap, tmp_path, layout) == 2
    assert _copy(tmp_path, layout) == ({b"a": b"a@25", b"b": b"b@40", b"c": b"c@40"}, 40)
    # A copy made from scratch sees the same.
    assert _restore(broker.bootstrap, tmp_path / "fresh", layout) == 6
    assert _copy(tmp_path / "fresh", layout) == ({b"a": b"a@25", b"b": b"b@40", b"c": b"c@40"}, 40)


def test_a_batch_the_copy_has_already_passed_changes_nothing(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _layout(broker, "stale")
    _send(
        broker.bootstrap,
        layout.changelog_topic,
        [
            (3, 50, b"a", b"a@50", "<>"),
            (3, 45, b"a", b"a@45", "<"),  # older values, written late
            (3, 45, b"b", b"b@45", ">"),
            (3, 60, b"c", b"c@60", "<>"),
        ],
    )
    assert _restore(broker.bootstrap, tmp_path, layout) == 2
    assert _copy(tmp_path, layout) == ({b"a": b"a@50", b"b": None, b"c": b"c@60"}, 60)
    assert _position(tmp_path, layout) == (3, 3)


def test_a_takeover_restore_moves_past_an_unclosed_batch_and_its_epoch(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _layout(broker, "tail")
    _send(
        broker.bootstrap,
        layout.changelog_topic,
        [
            (4, 10, b"a", b"a@10", "<>"),
            (6, 20, b"a", b"a@20", "<"),  # an owner of a higher epoch died mid-batch
        ],
    )
    assert _restore(broker.bootstrap, tmp_path, layout) == 1
    # The position is past the unclosed batch; the next owner writes above epoch 6.
    assert _position(tmp_path, layout) == (1, 6)
    # The rest of that batch, should it ever come, is not applied: its start was not read.
    _send(broker.bootstrap, layout.changelog_topic, [(6, 20, b"b", b"b@20", ">")])
    assert _restore(broker.bootstrap, tmp_path, layout) == 0
    assert _copy(tmp_path, layout) == ({b"a": b"a@10", b"b": None, b"c": None}, 10)


def test_a_restore_from_a_compacted_changelog_applies_what_compaction_kept(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """Compaction keeps only each key's newest record, so it removes the records that opened
    or closed many batches. Written as a=10 b=10 | a=20 c=20 | b=30 c=30 | (a new owner) b=40,
    it keeps a@20, which opened its batch, c@30, which closed its batch, and b@40. a@20's batch
    is closed by the next one's writer having folded from 20."""
    layout = _layout(broker, "compacted")
    _send(
        broker.bootstrap,
        layout.changelog_topic,
        [
            (1, 20, b"a", b"a@20", "<", 10),
            (1, 30, b"c", b"c@30", ">", 20),
            (2, 40, b"b", b"b@40", "<>", 30),
        ],
    )
    assert _restore(broker.bootstrap, tmp_path, layout) == 3
    assert _copy(tmp_path, layout) == ({b"a": b"a@20", b"b": b"b@40", b"c": b"c@30"}, 40)


def test_a_batch_cut_short_is_dropped_when_the_next_was_folded_from_before_it(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """A task that fails mid-batch is retried, or its query restarted from the offset its store
    holds; a writer that dies mid-batch is followed by one restored from before that batch.
    Either way the next batch is folded from before the cut one, which must not count as
    closed: its values would be ahead of the source offset the copy records."""
    layout = _layout(broker, "cut")
    _send(
        broker.bootstrap,
        layout.changelog_topic,
        [
            (1, 10, b"a", b"a@10", "<", -1),
            (1, 10, b"b", b"b@10", ">", -1),
            (1, 20, b"a", b"a@20", "<", 10),  # cut short: the task failed
            (1, 15, b"c", b"c@15", "<>", 10),  # the restarted query's first batch ends earlier
            (1, 25, b"b", b"b@25", "<", 15),  # cut short: the owner died
            (2, 22, b"a", b"a@22", "<>", 15),  # the new owner folds from 15 again
        ],
    )
    assert _restore(broker.bootstrap, tmp_path, layout) == 4
    assert _copy(tmp_path, layout) == ({b"a": b"a@22", b"b": b"b@10", b"c": b"c@15"}, 22)


def test_a_copy_resuming_between_batches_applies_one_whose_first_record_is_gone(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """A standby that was away while compaction ran resumes after the last batch it applied;
    the next batch may have lost its first record, and is applied all the same."""
    layout = _layout(broker, "resumed")
    _send(broker.bootstrap, layout.changelog_topic, [(1, 10, b"a", b"a@10", "<>", -1)])
    assert _restore(broker.bootstrap, tmp_path, layout) == 1
    _send(broker.bootstrap, layout.changelog_topic, [(1, 20, b"b", b"b@20", ">", 10)])
    assert _restore(broker.bootstrap, tmp_path, layout) == 1
    assert _copy(tmp_path, layout) == ({b"a": b"a@10", b"b": b"b@20", b"c": None}, 20)


def test_records_with_malformed_headers_are_ignored_not_fatal(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _layout(broker, "malformed")
    producer = Producer(producer_config(broker.bootstrap))
    for headers in (
        [(EPOCH_HEADER, b"1e308"), (SOURCE_OFFSET_HEADER, b"5")],
        [(EPOCH_HEADER, b"2"), (SOURCE_OFFSET_HEADER, b"\xff")],
        [(EPOCH_HEADER, b"2"), (SOURCE_OFFSET_HEADER, b"5"), (FOLDED_FROM_HEADER, b"x" * 5000)],
    ):
        producer.produce(layout.changelog_topic, key=b"a", value=b"forged", headers=headers)
    assert producer.flush(30) == 0
    _send(broker.bootstrap, layout.changelog_topic, [(1, 7, b"b", b"b@7", "<>")])
    _restore(broker.bootstrap, tmp_path, layout)
    assert _copy(tmp_path, layout) == ({b"a": None, b"b": b"b@7", b"c": None}, 7)


def test_a_standby_copy_that_fails_to_apply_retries_from_its_position_and_skips_nothing(
    broker: KafkaCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write to the copy fails once (injected into the real RocksDB writer): the copy reads
    its records again from the position its state records, and ends with every batch."""
    layout = _layout(broker, "retry")
    _send(
        broker.bootstrap,
        layout.changelog_topic,
        [(1, 10, b"a", b"a@10", "<>"), (1, 20, b"b", b"b@20", "<>"), (1, 30, b"c", b"c@30", "<>")],
    )
    failures = []
    commit = RocksDBWriter.commit

    def commit_failing_once(self: RocksDBWriter, offset: int, **kwargs: Any) -> None:
        if offset == 20 and not failures:
            failures.append(offset)
            raise OSError("injected: the disk is full")
        commit(self, offset, **kwargs)

    monkeypatch.setattr(RocksDBWriter, "commit", commit_failing_once)
    errors: list[BaseException] = []
    replicas = StandbyReplicas(
        bootstrap=broker.bootstrap,
        state_dir=tmp_path,
        layouts={"s": layout},
        on_error=errors.append,
    )
    try:
        replicas.assign([("s", 0)])
        deadline = time.monotonic() + 60
        while (
            replicas.lag("s", 0) != 0 or replicas.get("s", 0, b"c") != b"c@30"
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert failures == [20] and len(errors) == 1
        assert [replicas.get("s", 0, k) for k in (b"a", b"b", b"c")] == [b"a@10", b"b@20", b"c@30"]
        assert replicas.lag("s", 0) == 0
    finally:
        replicas.close()


class _ReassignedInEveryOtherPoll:
    """The standby copies' consumer, reassigned (as a copy taken up or released beside the
    others reassigns it) inside every other poll: after the thread noted the assignment it
    polls under, before the record comes back, which then comes from the new assignment."""

    def __init__(self, replicas: StandbyReplicas) -> None:
        self._replicas = replicas
        self._consumer = replicas._consumer
        self.polls = 0
        self.across = 0  # records a poll returned across a reassignment

    def poll(self, timeout: float) -> Any:
        self.polls += 1
        if self.polls % 2 == 0:
            return self._consumer.poll(timeout)
        with self._replicas._lock:
            self._replicas._reassign()
        deadline = time.monotonic() + 2  # all applied: nothing more comes
        while (
            (record := self._consumer.poll(timeout)) is None
            and time.monotonic() < deadline
            and not self._replicas._stopping.is_set()
        ):
            pass  # until the new assignment's first record: the record the race is about
        self.across += record is not None
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_a_standby_copy_reassigned_while_it_waits_for_a_record_skips_none(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """A record that a reassignment interrupted the wait for is fetched again, not skipped:
    the copy ends with every batch."""
    layout = _layout(broker, "reassigned")
    records: list[Record] = [(1, 10 * n, b"k%d" % n, b"v%d" % n, "<>") for n in range(1, 7)]
    _send(broker.bootstrap, layout.changelog_topic, records)
    replicas = StandbyReplicas(
        bootstrap=broker.bootstrap, state_dir=tmp_path, layouts={"s": layout}
    )
    consumer = _ReassignedInEveryOtherPoll(replicas)
    try:
        with replicas._lock:
            replicas._consumer = cast(Consumer, consumer)
        replicas.assign([("s", 0)])
        deadline = time.monotonic() + 60
        while replicas.applied_offset("s", 0) != 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert consumer.across > 0
        assert [replicas.get("s", 0, b"k%d" % n) for n in range(1, 7)] == [
            b"v%d" % n for n in range(1, 7)
        ]
    finally:
        replicas.close()


def test_standby_replicas_holding_nothing_follow_a_copy_given_after_all_were_released(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """A copy assigned after the only one was released is still followed, and closing an idle
    instance ends its replication thread."""
    layout = _layout(broker, "idle")
    _send(broker.bootstrap, layout.changelog_topic, [(1, 10, b"a", b"a@10", "<>")])
    replicas = StandbyReplicas(
        bootstrap=broker.bootstrap, state_dir=tmp_path, layouts={"s": layout}
    )
    try:
        replicas.assign([("s", 0)])
        replicas.release([("s", 0)])
        assert replicas.held() == frozenset()
        replicas.assign([("s", 0)])
        deadline = time.monotonic() + 60
        while replicas.get("s", 0, b"a") != b"a@10" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replicas.get("s", 0, b"a") == b"a@10"
        replicas.release([("s", 0)])
    finally:
        replicas.close()
    assert not replicas._thread.is_alive()
