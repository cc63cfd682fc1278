"""The tail's kept records (``EndOffsets(keep_records=...)``) are exactly what a read of the same
offsets gives, and the source plans a small micro-batch with them instead of a fetch."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from foldstream.broker import KafkaCluster
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from foldstream.offsets import EndOffsets, KeptRecords, TailRecord
from foldstream.projections.chunks import records_of_messages, records_of_planned
from foldstream.projections.source import (
    FoldStreamReader,
    KafkaRange,
    KafkaRanges,
    read_messages,
    write_owned,
)


def new_topic(broker: KafkaCluster, partitions: int = 2) -> str:
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, partitions)])
    return topic


def produce(broker: KafkaCluster, topic: str, partition: int, count: int, tag: str) -> None:
    producer = Producer(producer_config(broker.bootstrap, linger_ms=5))
    for n in range(count):
        producer.produce(
            topic,
            key=f"{tag}-{n}".encode(),
            value=json.dumps({"n": n}).encode(),
            partition=partition,
            headers=[("tag", tag.encode()), ("empty", None)],
        )
    assert producer.flush(30) == 0


def produce_transaction(broker: KafkaCluster, topic: str, partition: int, count: int) -> None:
    """``count`` records in one committed transaction: its marker takes an offset of its own."""
    producer = Producer(
        producer_config(broker.bootstrap, **{"transactional.id": f"tail-{uuid.uuid4().hex}"})
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(count):
        producer.produce(topic, key=b"tx-%d" % n, value=b"{}", partition=partition)
    producer.commit_transaction(30)


def reached(ends: EndOffsets, wanted: dict[int, int], timeout: float = 20.0) -> dict[int, int]:
    """The ends, once every partition of ``wanted`` reached its offset (there, not beyond)."""
    deadline = time.monotonic() + timeout
    while (now := ends.wait_beyond({p: o - 1 for p, o in wanted.items()}, 0.1)) != {
        **now,
        **wanted,
    }:
        assert time.monotonic() < deadline, f"ends {now}, waiting for {wanted}"
    return now


def read(broker: KafkaCluster, topic: str, spans: list[KafkaRange]) -> list[TailRecord]:
    """What a task's fetch of ``spans`` gives, as the tail keeps records."""
    return [
        TailRecord(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1])
        for fetch in read_messages(broker.bootstrap, topic, spans)
        for m in fetch
    ]


def test_kept_records_are_what_a_read_of_the_same_offsets_gives(broker: KafkaCluster) -> None:
    topic = new_topic(broker)
    produce(broker, topic, 0, 5, "before")  # before the tail started: never kept
    ends = EndOffsets(broker.bootstrap, topic, [0, 1], keep_records=100)
    try:
        assert ends.ends() == {0: 5, 1: 0}
        produce_transaction(broker, topic, 0, 3)
        produce(broker, topic, 0, 2, "after")
        produce(broker, topic, 1, 4, "other")
        now = reached(ends, {0: 11, 1: 4})  # 5 + 3 + the transaction's marker + 2
        for partition, start in ((0, 5), (1, 0)):
            kept = ends.records(partition, start, now[partition])
            assert kept is not None
            assert kept == read(broker, topic, [KafkaRange(partition, start, now[partition])])
        assert len(ends.records(0, 5, now[0]) or []) == 5  # the marker's offset holds no record
        # The tail started at the end the broker reported: it kept nothing from before that.
        assert ends.records(0, 0, now[0]) is None
        assert ends.records(0, 5, now[0] + 1) is None  # beyond the known end
        ends.forget_below({0: now[0] - 1})
        assert ends.records(0, 5, now[0]) is None
        last = ends.records(0, now[0] - 1, now[0])
        assert last is not None and [r.key for r in last] == [b"after-1"]
    finally:
        ends.close()


def test_only_the_newest_records_are_kept_past_the_limit(broker: KafkaCluster) -> None:
    topic = new_topic(broker, 1)
    ends = EndOffsets(broker.bootstrap, topic, [0], keep_records=4)
    try:
        assert ends.ends() == {0: 0}
        produce(broker, topic, 0, 10, "many")
        reached(ends, {0: 10})
        assert ends.records(0, 0, 10) is None
        newest = ends.records(0, 8, 10)
        assert newest is not None and [r.offset for r in newest] == [8, 9]
    finally:
        ends.close()


def kept(ends: EndOffsets, partition: int, start: int, end: int) -> list[TailRecord]:
    """The kept records of ``[start, end)``, once the tail holds them all."""
    deadline = time.monotonic() + 20
    while (found := ends.records(partition, start, end)) is None:
        assert time.monotonic() < deadline, f"{start}..{end} of {partition} never kept"
        time.sleep(0.02)
    return found


def test_a_partition_far_past_its_floor_is_paused_and_probed(broker: KafkaCluster) -> None:
    """Records more than the kept number past the floor could not be served: the tail stops
    reading them, still knows the end, and reads on from the floor once it came near."""
    topic = new_topic(broker, 1)
    ends = EndOffsets(broker.bootstrap, topic, [0], keep_records=4)
    try:
        assert ends.ends() == {0: 0}
        ends.forget_below({0: 0})
        produce(broker, topic, 0, 20, "backlog")
        reached(ends, {0: 20})
        # Paused: not even the newest records are kept (without the pause, 18 and 19 are).
        assert ends.records(0, 18, 20) is None
        produce(broker, topic, 0, 10, "while-paused")
        assert ends.ends() == {0: 30}  # probed, not read
        assert ends.records(0, 28, 30) is None
        ends.forget_below({0: 27})  # folded up to 27: within 4 of the end
        assert kept(ends, 0, 27, 30) == read(broker, topic, [KafkaRange(0, 27, 30)])
        ends.forget_below({0: 29})
        produce(broker, topic, 0, 2, "after")
        reached(ends, {0: 32})
        assert kept(ends, 0, 29, 32) == read(broker, topic, [KafkaRange(0, 29, 32)])
        produce(broker, topic, 0, 3, "ahead again")  # 6 past the floor: paused again
        reached(ends, {0: 35})
        assert ends.records(0, 33, 35) is None
    finally:
        ends.close()


def test_a_partition_paused_before_it_was_read_to_its_end_has_its_end(
    broker: KafkaCluster,
) -> None:
    """A projection starting from 0 on a topic with history: its floor is 0 before the tail,
    which starts at the reported end, has read anything (paused at once, its end probed)."""
    topic = new_topic(broker, 1)
    producer = Producer(producer_config(broker.bootstrap, linger_ms=50))
    for n in range(20):
        producer.produce(topic, key=b"k", value=b"%d" % n, partition=0)
    assert producer.flush(30) == 0
    ends = EndOffsets(broker.bootstrap, topic, [0], keep_records=4)
    try:
        ends.forget_below({0: 0})
        assert ends.ends(timeout=10) == {0: 20}
        assert ends.wait_beyond({0: 0}, timeout=1) == {0: 20}
    finally:
        ends.close()


def test_a_partition_no_longer_kept_reads_on_from_its_end(broker: KafkaCluster) -> None:
    topic = new_topic(broker, 2)
    ends = EndOffsets(broker.bootstrap, topic, [0, 1], keep_records=4)
    try:
        assert ends.ends() == {0: 0, 1: 0}
        ends.forget_below({0: 0, 1: 0})
        produce(broker, topic, 0, 12, "backlog")
        reached(ends, {0: 12})
        assert ends.records(0, 10, 12) is None  # paused
        ends.keep_only({1})
        produce(broker, topic, 0, 3, "later")
        # Read again, not probed: the end moves without a probe (timeout 0 never probes).
        deadline = time.monotonic() + 20
        while ends.ends(timeout=0)[0] != 15:
            assert time.monotonic() < deadline, ends.ends(timeout=0)
            time.sleep(0.02)
    finally:
        ends.close()


def test_a_small_micro_batch_is_planned_with_its_records(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = new_topic(broker)
    owned = tmp_path / "owned.json"
    write_owned(owned, {0: 0, 1: 0})
    reader = FoldStreamReader(  # planning only: the options of the fold are not needed
        {"bootstrap": broker.bootstrap, "topic": topic, "partitions": "0,1", "owned": str(owned)}
    )
    try:
        assert reader.latestOffset({}, ReadAllAvailable()) == {"0": 0, "1": 0}
        produce(broker, topic, 0, 3, "a")
        produce(broker, topic, 1, 2, "b")
        start = {"0": 0, "1": 0}
        reached(reader._end_offsets(), {0: 3, 1: 2})
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {"0": 3, "1": 2}
        (planned,) = reader.partitions(start, end)
        assert isinstance(planned, KafkaRanges) and planned.planned is not None
        from_tail = records_of_planned(planned.planned)
        # The same ranges, fetched as a task does when a micro-batch was planned without them.
        (fetched,) = read_messages(broker.bootstrap, topic, planned.spans)
        assert from_tail == records_of_messages(fetched)
        assert [len(from_tail[p]) for p in (0, 1)] == [3, 2]
        reader.commit(end)  # folded: the tail keeps none of them any more
        (replanned,) = reader.partitions(start, end)
        assert isinstance(replanned, KafkaRanges) and replanned.planned is None
    finally:
        reader.stop()


def test_a_micro_batch_ends_before_an_open_transaction_and_skips_it_aborted(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """Spark's ``latestOffset`` under an open transaction is the last stable offset: the
    planner waits (:data:`IDLE_WAIT_S`) for more and plans nothing of it, nor of the records
    behind it. Once the transaction is aborted (its writer fenced), the micro-batch planned
    with the tail's records holds the records behind it only."""
    topic = new_topic(broker, 1)
    owned = tmp_path / "owned.json"
    write_owned(owned, {0: 0})
    reader = FoldStreamReader(
        {"bootstrap": broker.bootstrap, "topic": topic, "partitions": "0", "owned": str(owned)}
    )
    transactional_id = f"tail-{uuid.uuid4().hex}"
    try:
        assert reader.latestOffset({}, ReadAllAvailable()) == {"0": 0}
        produce(broker, topic, 0, 2, "before")
        reached(reader._end_offsets(), {0: 2})
        writer = Producer(
            producer_config(broker.bootstrap, **{"transactional.id": transactional_id})
        )
        writer.init_transactions(30)
        writer.begin_transaction()
        for n in range(3):
            writer.produce(topic, key=b"zombie-%d" % n, value=b"{}", partition=0)
        assert writer.flush(30) == 0  # offsets 2-4, open
        produce(broker, topic, 0, 1, "behind")  # offset 5
        assert reader.latestOffset({"0": 2}, ReadAllAvailable()) == {"0": 2}
        Producer(
            producer_config(broker.bootstrap, **{"transactional.id": transactional_id})
        ).init_transactions(30)  # fences the writer: its transaction is aborted (marker: 6)
        end = reader.latestOffset({"0": 2}, ReadAllAvailable())
        assert end == {"0": 7}
        (planned,) = reader.partitions({"0": 2}, end)
        assert isinstance(planned, KafkaRanges) and planned.planned is not None
        assert [r.key for _, records in planned.planned for r in records] == [b"behind-0"]
    finally:
        reader.stop()


class Message:
    """What :class:`KeptRecords` reads of a consumer's message (a record, not an error)."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000 + self._offset


def offsets(kept: list[Message] | None) -> list[int] | None:
    return None if kept is None else [m.offset() for m in kept]


def test_a_consumer_that_went_back_claims_nothing_it_has_not_read_again() -> None:
    kept = KeptRecords(limit=100)
    for offset in range(10):
        kept.on_record(0, Message(offset))
    assert offsets(kept.messages(0, 5, 10)) == [5, 6, 7, 8, 9]
    for offset in (5, 6):  # an offset reset sent the consumer back to 5
        kept.on_record(0, Message(offset))
    assert kept.messages(0, 5, 10) is None  # 7-9 are not read again yet
    assert offsets(kept.messages(0, 5, 7)) == [5, 6]
    assert kept.messages(0, 4, 7) is None


def test_an_error_or_a_pause_in_keeping_starts_the_range_again() -> None:
    kept = KeptRecords(limit=100)
    kept.on_end(0, 3)
    kept.on_record(0, Message(4))  # offset 3 held a transaction marker
    assert offsets(kept.messages(0, 3, 5)) == [4]
    kept.forget(0)  # the consumer reported an error
    kept.on_record(0, Message(7))
    assert kept.messages(0, 3, 8) is None and offsets(kept.messages(0, 7, 8)) == [7]
    kept.keep_only({1})
    kept.on_record(0, Message(8))  # not kept: nobody reads partition 0 now
    kept.keep_only({0, 1})
    kept.on_record(0, Message(9))
    assert kept.messages(0, 7, 10) is None  # 8 was read while partition 0 was not kept
    assert offsets(kept.messages(0, 9, 10)) == [9]


def test_a_limit_of_one_keeps_the_newest_record() -> None:
    kept = KeptRecords(limit=1)
    for offset in range(3):
        kept.on_record(0, Message(offset))
    assert offsets(kept.messages(0, 2, 3)) == [2] and kept.messages(0, 1, 3) is None


def test_forgetting_past_what_was_read_keeps_nothing_stale() -> None:
    kept = KeptRecords(limit=100)
    for offset in range(5):
        kept.on_record(0, Message(offset))
    kept.forget_below(0, 3)
    assert offsets(kept.messages(0, 3, 5)) == [3, 4] and kept.messages(0, 2, 5) is None
    kept.forget_below(0, 8)  # beyond what was read: the range starts again
    kept.on_record(0, Message(5))
    assert offsets(kept.messages(0, 5, 6)) == [5]


def test_an_end_below_what_was_kept_drops_it() -> None:
    kept = KeptRecords(limit=100)
    for offset in range(10):
        kept.on_record(0, Message(offset))
    kept.on_end(0, 7)  # the log was cut back to 7: offsets 7-9 may hold other records now
    assert kept.messages(0, 5, 10) is None and kept.messages(0, 5, 7) is None
    kept.on_record(0, Message(7))
    assert offsets(kept.messages(0, 7, 8)) == [7]
