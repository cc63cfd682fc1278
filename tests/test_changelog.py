"""Copies of a store partition follow its changelog: whole batches, fenced by writer epoch."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer

from foldstream.broker import EmbeddedBroker
from foldstream.changelog import (
    BATCH_END_HEADER,
    BATCH_START_HEADER,
    EPOCH_HEADER,
    SOURCE_OFFSET_HEADER,
    StoreLayout,
    open_copy,
    restore,
)
from foldstream.kafka import TopicSpec, ensure_topics, producer_config

Record = tuple[int, int, bytes, bytes, str]
"""(writer epoch, source offset, key, value, marks: "<" opens its batch, ">" closes it)"""


def _send(bootstrap: str, topic: str, records: list[Record]) -> None:
    producer = Producer(producer_config(bootstrap))
    for epoch, source_offset, key, value, marks in records:
        headers = [
            (SOURCE_OFFSET_HEADER, str(source_offset).encode()),
            (EPOCH_HEADER, str(epoch).encode()),
        ]
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


def _layout(broker: EmbeddedBroker, name: str) -> StoreLayout:
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


def test_a_previous_owners_late_writes_are_ignored(broker: EmbeddedBroker, tmp_path: Path) -> None:
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
    broker: EmbeddedBroker, tmp_path: Path
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
    broker: EmbeddedBroker, tmp_path: Path
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
