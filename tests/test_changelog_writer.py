"""The changelog's writer, fenced at the broker: the next owner's fence aborts a previous
owner's open transaction and refuses its later writes; a fenced hold refuses tasks and is
taken again with a new writer; copies of a transactional changelog catch up to its end, past
the transaction markers. On the session's broker, with real store hosts and copies."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.changelog import ChangelogWriter, StandbyReplicas, StoreLayout, open_copy, restore
from foldstream.changelog.batches import batch_headers, send_batch
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from foldstream.state.held import ChangelogFenced, PartitionClosed
from foldstream.state.host import RemotePartition, StoreHost


def _layout(broker: KafkaCluster) -> StoreLayout:
    """A store layout whose (one-partition, compacted) changelog topic exists."""
    name = f"writer-{uuid.uuid4().hex[:8]}"
    layout = StoreLayout(f"{name}.events", f"{name}.changelog")
    ensure_topics(broker.bootstrap, [TopicSpec(layout.changelog_topic, 1, compact=True)])
    return layout


def _writer(broker: KafkaCluster, layout: StoreLayout) -> ChangelogWriter:
    return ChangelogWriter.fenced(
        bootstrap=broker.bootstrap, topic=layout.changelog_topic, partition=0
    )


def _restored(broker: KafkaCluster, state_dir: Path, layout: StoreLayout) -> dict[bytes, bytes]:
    restore(bootstrap=broker.bootstrap, state_dir=state_dir, store="s", layout=layout, partition=0)
    copy = open_copy(state_dir, "s", layout, 0)
    try:
        return {k: v for k in (b"a", b"b", b"c") if (v := copy.get(k)) is not None}
    finally:
        copy.close()


def test_the_next_owners_fence_aborts_an_open_transaction_and_refuses_later_writes(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _layout(broker)
    old = _writer(broker, layout)
    assert (
        old.write(
            {b"a": b"a@1"},
            source_offset=1,
            folded_from=None,
            epoch=1,
            source_id=None,
            position=None,
        )
        is not None
    )
    # The old owner stands still inside its next transaction, its records on the broker.
    stalled = Producer(
        producer_config(broker.bootstrap, **{"transactional.id": old.transactional_id})
    )
    stalled.init_transactions(30)  # the same id: as the old owner's writer, later in its life
    stalled.begin_transaction()
    headers = batch_headers(2, 1, 1, None)
    send_batch(stalled, layout.changelog_topic, 0, {b"a": b"a@2", b"b": b"b@2"}, headers, print)
    assert stalled.flush(30) == 0
    new = _writer(broker, layout)  # the next owner takes the partition over
    try:
        with pytest.raises(Exception, match="(?i)fenced"):
            stalled.commit_transaction(30)
        with pytest.raises(ChangelogFenced):
            old.write(
                {b"c": b"c@3"}, source_offset=3, folded_from=1, epoch=1, source_id=None,
                position=None,
            )  # fmt: skip
        assert (
            new.write(
                {b"b": b"b@5"}, source_offset=5, folded_from=1, epoch=2, source_id=None, position=0
            )
            is not None
        )
        # A copy sees the committed batches only: not the aborted one, nor the refused one.
        assert _restored(broker, tmp_path, layout) == {b"a": b"a@1", b"b": b"b@5"}
    finally:
        for writer in (old, new):
            writer.close()


def test_a_hold_fenced_by_another_refuses_tasks_until_it_is_taken_again(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _layout(broker)
    host = StoreHost(state_dir=tmp_path)
    host.start()
    try:
        host.open("s", 0, identity="t/0", epoch=1, changelog=_writer(broker, layout))
        task = RemotePartition(host.address, host.authkey, "s", 0, [b"a"])
        task.put(b"a", b"a@0")
        task.commit(0)
        late = RemotePartition(host.address, host.authkey, "s", 0, [b"a"])
        other = _writer(broker, layout)  # another instance takes the partition over
        other.close()
        late.put(b"a", b"late")
        with pytest.raises(PartitionClosed, match="fenced"):  # as the task sees it
            late.commit(1)
        held = host.partition("s", 0)
        assert held is not None and host.fenced("s", 0)
        assert (held.get(b"a"), held.applied_offset()) == (b"a@0", 0)  # lookups go on
        with pytest.raises(PartitionClosed, match="fenced"):
            RemotePartition(host.address, host.authkey, "s", 0, [b"a"])  # tasks are refused
        # Taken again (still held: its new writer fenced the other's), it takes writes again.
        assert host.open("s", 0, identity="t/0", epoch=3, changelog=_writer(broker, layout)) == 1
        assert not host.fenced("s", 0)
        again = RemotePartition(host.address, host.authkey, "s", 0, [b"a"])
        again.put(b"a", b"a@1")
        again.commit(1)
    finally:
        host.stop()
    assert _restored(broker, tmp_path / "copy", layout) == {b"a": b"a@1"}


def test_a_standby_copy_of_a_transactional_changelog_catches_up_past_its_markers(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """Each transaction ends with a marker taking an offset of its own: the copy counts
    itself caught up (lag 0) at the end all the same, ready for a takeover."""
    layout = _layout(broker)
    writer = _writer(broker, layout)
    replicas = StandbyReplicas(
        bootstrap=broker.bootstrap, state_dir=tmp_path, layouts={"s": layout}
    )
    try:
        position = None
        for offset, key in enumerate((b"a", b"b", b"c")):
            position = writer.write(
                {key: b"%s@%d" % (key, offset)}, source_offset=offset,
                folded_from=offset - 1 if offset else None, epoch=1, source_id=None,
                position=position,
            )  # fmt: skip
        replicas.assign([("s", 0)])
        deadline = time.monotonic() + 60
        while (replicas.applied_offset("s", 0), replicas.lag("s", 0)) != (2, 0):
            assert time.monotonic() < deadline, (
                replicas.applied_offset("s", 0),
                replicas.lag("s", 0),
            )
            time.sleep(0.05)
        assert replicas.get("s", 0, b"c") == b"c@2"
    finally:
        replicas.close()
        writer.close()
