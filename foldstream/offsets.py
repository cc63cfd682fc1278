"""The true end of each partition of a topic, kept current by a tailing consumer.

Some Kafka-protocol brokers under-report the log end offset (ListOffsets, watermarks), which would
leave the tail of a partition unread forever. The end offsets here are instead learnt from data:
the consumer starts at the reported end, reads whatever lies beyond it, and records the offset
after the last record it saw or the end-of-partition position. This is correct on every broker,
and the only place in foldstream that needs to know about the problem.

Optionally the tail also keeps the records it reads (:meth:`EndOffsets.records`): a projection's
source plans its micro-batches from these ends, so the records of a small micro-batch are already
in hand when it is planned, and its task need not fetch them again.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

from foldstream.domain.records import kafka_timestamp
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import BOUNDED_PREFETCH_KBYTES, consume_available, consumer_config


class TailRecord(NamedTuple):
    """A record the tail read: its offset, key, value, headers and timestamp (milliseconds,
    None when it has none) as the consumer gave them."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp: int | None = None

    @classmethod
    def from_message(cls, message: Any) -> TailRecord:
        """The record a consumer's message holds, as
        :meth:`~foldstream.domain.records.EventRecord.from_message` reads it."""
        return cls(
            message.offset(),
            message.key(),
            message.value(),
            message.headers(),
            kafka_timestamp(message.timestamp()),
        )


class KeptRecords:
    """The records a tailing consumer read, per partition, up to ``limit`` each (the newest;
    none with a limit of 0).

    Invariant: for a partition with a range ``[start, end)``, every record the consumer was
    given at an offset in it is kept, in offset order. Offsets that hold no record a consumer
    is given (transaction markers, aborted or compacted records) are gaps in the list, as they
    are in a read. Whatever breaks the consumer's run forward (an error, going back to an
    earlier offset, not being kept for a while) starts the partition's range again.

    The consumer's messages are kept as they are, and a :class:`TailRecord` is built only for a
    range :meth:`EndOffsets.records` serves: behind a backlog most kept records are dropped
    unserved, and building one for each read record was most of the tail's CPU.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: dict[int, list[Any]] = {}
        self._start: dict[int, int] = {}
        self._end: dict[int, int] = {}
        self._only: set[int] | None = None

    def keeps(self, partition: int) -> bool:
        return self.limit > 0 and (self._only is None or partition in self._only)

    def on_record(self, partition: int, message: Any) -> None:
        """The consumer gave ``message`` (of ``partition``)."""
        if not self.keeps(partition):
            return
        offset = message.offset()
        kept = self._kept.setdefault(partition, [])
        start = self._start.get(partition)
        if start is None or offset < start or (kept and offset <= kept[-1].offset()):
            kept.clear()  # the first record, or the consumer went back (an offset reset)
            self._start[partition] = offset
        kept.append(message)
        self._end[partition] = offset + 1
        if len(kept) > self.limit:
            del kept[: len(kept) - max(1, self.limit // 2)]
            self._start[partition] = kept[0].offset()

    def on_end(self, partition: int, offset: int) -> None:
        """The consumer reached the end of ``partition``, at ``offset``."""
        if not self.keeps(partition):
            return
        if offset < self._end.get(partition, offset):
            # The log was cut back (an unclean leader election): what was kept from there on
            # may be written again with other records.
            self.forget(partition)
        self._start.setdefault(partition, offset)
        self._end[partition] = offset

    def forget(self, partition: int) -> None:
        """Drop all of ``partition``: its range starts again with the next record or end."""
        self._kept.pop(partition, None)
        self._start.pop(partition, None)
        self._end.pop(partition, None)

    def keep_only(self, partitions: set[int]) -> None:
        """Keep ``partitions`` only from now on (the others are dropped)."""
        self._only = set(partitions)
        # A partition not kept for a while may be kept again later: what it kept before says
        # nothing about what it missed meanwhile.
        for partition in (set(self._kept) | set(self._start)) - self._only:
            self.forget(partition)

    def messages(self, partition: int, start: int, end: int) -> list[Any] | None:
        """The consumer's messages at offsets ``[start, end)``, or None unless the range is
        kept whole."""
        kept_start, kept_end = self._start.get(partition), self._end.get(partition, -1)
        if kept_start is None or kept_start > start or kept_end < end:
            return None
        kept = self._kept.get(partition, [])
        first = bisect.bisect_left(kept, start, key=_offset)
        return kept[first : bisect.bisect_left(kept, end, key=_offset)]

    def forget_below(self, partition: int, offset: int) -> None:
        """Drop the records below ``offset``."""
        kept_start = self._start.get(partition)
        if kept_start is None or offset <= kept_start:
            return
        if offset > self._end.get(partition, -1):
            self.forget(partition)  # nothing kept is needed
            return
        kept = self._kept.get(partition, [])
        del kept[: bisect.bisect_left(kept, offset, key=_offset)]
        self._start[partition] = offset


class EndOffsets:
    """Tracks ``{partition: end offset}`` of ``topic`` in a background thread.

    With ``keep_records`` > 0 it also keeps the last records it read of each partition (up to
    that many), for :meth:`records`.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: list[int],
        *,
        fetch_wait_max_ms: int = 10,
        keep_records: int = 0,
    ) -> None:
        self.topic = topic
        self.partitions = list(partitions)
        self._kept = KeptRecords(keep_records)
        self._ends: dict[int, int] = {}
        self._known: set[int] = set()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._consumer = Consumer(
            consumer_config(
                bootstrap,
                fetch_wait_max_ms=fetch_wait_max_ms,
                **{
                    "fetch.message.max.bytes": 65536,
                    "queued.max.messages.kbytes": BOUNDED_PREFETCH_KBYTES,
                },
            )
        )
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in self.partitions])
        self._thread = threading.Thread(target=self._run, name=f"end-offsets-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            messages = consume_available(self._consumer, 10_000, 0.05)
            if not messages:
                continue
            with self._changed:
                for message in messages:
                    error = message.error()
                    partition = message.partition()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            self._kept.forget(partition)
                            continue
                        end = message.offset()
                        self._known.add(partition)
                        self._kept.on_end(partition, end)
                    else:
                        end = message.offset() + 1
                        self._kept.on_record(partition, message)
                    if end > self._ends.get(partition, -1):
                        self._ends[partition] = end
                self._changed.notify_all()

    def keep_only(self, partitions: set[int]) -> None:
        """Keep the records of ``partitions`` only, from now on."""
        with self._changed:
            self._kept.keep_only(partitions)

    def records(self, partition: int, start: int, end: int) -> list[TailRecord] | None:
        """The records at offsets ``[start, end)`` of ``partition``, when the tail read all of
        them and still keeps them; None otherwise (read them from the broker then).

        Offsets in the range that hold no record a consumer is given (transaction markers,
        aborted or compacted records) are missing from the list, as they are from a read.
        """
        with self._changed:
            messages = self._kept.messages(partition, start, end)
        # Built outside the lock: the tail thread reads on meanwhile.
        return _tail_records(messages)

    def forget_below(self, offsets: dict[int, int]) -> None:
        """Drop the kept records below ``offsets[partition]`` (those are folded already)."""
        with self._changed:
            for partition, offset in offsets.items():
                self._kept.forget_below(partition, offset)

    def ends(self, timeout: float = 30.0) -> dict[int, int]:
        """The end offset of every partition; waits until each has been read to its end once."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._known) < len(self.partitions):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(self.partitions) - self._known)
                    raise BrokerUnavailable(
                        f"could not read to the end of {self.topic} partitions {missing} "
                        f"within {timeout}s"
                    )
                self._changed.wait(remaining)
            return dict(self._ends)

    def wait_beyond(self, offsets: dict[int, int], timeout: float) -> dict[int, int]:
        """Wait up to ``timeout`` until some partition's end passes ``offsets``; return the ends."""
        self.ends()
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(self._ends.get(p, 0) > o for p, o in offsets.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            ends = dict(self._ends)
        return ends

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._consumer.close()


def _offset(message: Any) -> int:
    return message.offset()  # type: ignore[no-any-return]


def _tail_records(messages: list[Any] | None) -> list[TailRecord] | None:
    return None if messages is None else [TailRecord.from_message(m) for m in messages]


def holds_records(
    bootstrap: str, topic: str, partition: int, start: int, end: int, *, timeout: float = 5.0
) -> bool:
    """Whether a consumer finds any record at offsets ``[start, end)`` of ``partition``.

    Some offsets hold no record a consumer is given: transaction markers (every committed
    transaction ends with one), records of aborted transactions, compacted-away records. So a
    store that applied everything up to ``start`` is caught up with ``end`` when this is False,
    although ``end - start > 0``.
    """
    if end <= start:
        return False
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            message = consumer.poll(remaining)
            if message is None:
                break
            error, offset = message.error(), message.offset()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise BrokerUnavailable(f"reading {topic}/{partition}: {error}")
            if offset is None:
                continue
            if error is None:
                return bool(offset < end)
            if offset >= end:
                return False
    finally:
        consumer.close()
    raise BrokerUnavailable(f"could not read {topic}/{partition} from {start} within {timeout}s")


#: How long a fetch at a recorded position may go unanswered before the partition's end is
#: learnt by reading up to it instead (see :func:`positions_within`).
POSITION_ANSWER_S = 3.0

Position = tuple[str, int]
"""``(topic, partition)``."""


def positions_within(
    bootstrap: str,
    positions: dict[Position, int],
    *,
    answer_s: float = POSITION_ANSWER_S,
    timeout: float = 30.0,
) -> dict[Position, bool]:
    """Whether each of ``positions`` (``{(topic, partition): offset}``, the next offset a
    reader would read) lies within its partition: at or before the partition's end.

    A position past the end is one recorded before its topic was deleted and created again (a
    broker that keeps its data in memory restarted, a topic recreated, another cluster). Each
    partition is read from its position with offset resets turned off: a record or the end of
    the partition answers that it lies within, and Kafka answers OFFSET_OUT_OF_RANGE past the
    end. Some brokers (Tansu) answer a fetch past the end with nothing at all, and under-report
    ends: a partition left unanswered for ``answer_s`` has its end learnt by reading from its
    reported end, which is never above the true one, to the end of the partition. A position
    below a partition's first offset (records deleted by retention) counts as within.
    """
    found = {key: True for key, offset in positions.items() if offset <= 0}
    asked = {key: offset for key, offset in positions.items() if key not in found}
    if not asked:
        return found
    # No reset: a position past the end must be answered as such, not moved to the start.
    config = consumer_config(bootstrap)
    config["auto.offset.reset"] = "error"
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in asked.items()])
        deadline = time.monotonic() + answer_s
        while len(found) < len(positions) and time.monotonic() < deadline:
            for message in consume_available(consumer, 1000, 0.05):
                key = (message.topic(), message.partition())
                if key in asked and key not in found:
                    found[key] = _answered_within(consumer, message, asked[key], timeout)
        unanswered = {key: asked[key] for key in asked if key not in found}
        found |= _read_up_to(consumer, unanswered, timeout)
    finally:
        consumer.close()
    return found


def _answered_within(consumer: Any, message: Any, position: int, timeout: float) -> bool:
    """Whether the answer ``message`` to a fetch at ``position`` says it lies within."""
    error = message.error()
    if error is None or error.code() == KafkaError._PARTITION_EOF:
        return True
    if error.code() not in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        raise BrokerUnavailable(f"reading {message.topic()}/{message.partition()}: {error}")
    low, _ = consumer.get_watermark_offsets(
        TopicPartition(message.topic(), message.partition()), timeout=timeout
    )
    return bool(position < low)  # below the start (retention), not past the end


def _read_up_to(
    consumer: Any, positions: dict[Position, int], timeout: float
) -> dict[Position, bool]:
    """Whether each partition's end reaches its position, read from its reported end on."""
    found: dict[Position, bool] = {}
    starts = {}
    for (topic, partition), position in positions.items():
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
        if position <= high:
            found[(topic, partition)] = True
        else:
            starts[(topic, partition)] = max(high, low, 0)
    if not starts:
        return found
    consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])
    deadline = time.monotonic() + timeout
    while len(found) < len(positions):
        if time.monotonic() > deadline:
            missing = sorted(set(starts) - set(found))
            raise BrokerUnavailable(f"could not read to the end of {missing} within {timeout}s")
        for message in consume_available(consumer, 1000, 0.1):
            key = (message.topic(), message.partition())
            if key not in starts or key in found:
                continue
            error = message.error()
            if error is None:
                if message.offset() + 1 >= positions[key]:
                    found[key] = True
            elif error.code() == KafkaError._PARTITION_EOF:
                found[key] = message.offset() >= positions[key]
            else:
                raise BrokerUnavailable(f"reading {key[0]}/{key[1]}: {error}")
    return found
