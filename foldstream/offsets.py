"""The end of each partition of a topic, kept current by a tailing consumer that keeps the
records it reads, for a projection's micro-batches.

A projection's source plans its micro-batches from these ends, so the records of a small
micro-batch are already in hand when it is planned (:meth:`EndOffsets.records`), and its task
need not fetch them again; the tail also wakes the planner as soon as records arrive. The
consumer starts at the end Kafka reports and reads committed records only: an end is the
offset after the last record read or where the consumer reports the partition's end, the last
stable offset, so a micro-batch never reaches into an open transaction. (For the ends alone,
:mod:`foldstream.end_probes` asks the broker instead of reading every record.)
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from foldstream.domain.records import kafka_timestamp
from foldstream.end_probes import ProbedEnds
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import consume_available, tail_config

log = logging.getLogger(__name__)


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


#: How long asking for the ends waits for a probe of the paused partitions, at most; their last
#: ends are given when it does not answer in time.
PAUSED_PROBE_S = 2.0


class EndOffsets:
    """Tracks ``{partition: end offset}`` of ``topic`` in a background thread.

    With ``keep_records`` > 0 it also keeps the last records it read of each partition (up to
    that many), for :meth:`records`; and a partition whose records were read more than that
    many past its floor (the offset :meth:`forget_below` gave last: what is folded) is paused
    until the floor comes within that many of its end again. Its records there could not be
    served (:meth:`records` serves ranges from the floor, of at most ``keep_records``), and
    behind a backlog reading them was a cost per record for nothing: meanwhile its end is
    probed (:class:`~foldstream.end_probes.ProbedEnds`) when asked.
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
        self._floors: dict[int, int] = {}
        self._paused: set[int] = set()
        self._resume_at: dict[int, int] = {}
        self._bootstrap = bootstrap
        self._probe: ProbedEnds | None = None  # made at the first pause: most tails never pause
        self._consumer = Consumer(tail_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms))
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in self.partitions])
        self._thread = threading.Thread(target=self._run, name=f"end-offsets-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._resume_due()
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
                self._pause_far_ahead()
                self._changed.notify_all()

    def _pause_far_ahead(self) -> None:
        """Pause the partitions read more than the kept records past their floor (the class's
        docstring). Called with the lock held, in the tail's thread."""
        limit = self._kept.limit
        ahead = [
            p
            for p, floor in self._floors.items()
            if p not in self._paused and self._ends.get(p, floor) - floor > limit
        ]
        if ahead:
            # Pausing drops what was fetched of them: nothing read before it arrives after.
            try:
                self._consumer.pause([TopicPartition(self.topic, p) for p in ahead])
            except KafkaException:  # read on: the next batch of records tries again
                log.warning("could not pause %s %s", self.topic, ahead, exc_info=True)
                return
            for p in ahead:
                self._paused.add(p)
                self._kept.forget(p)

    def _resume_due(self) -> None:
        """Read on from their floor the paused partitions whose floor came near their end."""
        with self._changed:
            due, self._resume_at = self._resume_at, {}
        for partition, offset in due.items():
            # The seek drops what was fetched before it, as pausing does; the range kept
            # starts again with the first record read from the floor.
            try:
                self._consumer.seek(TopicPartition(self.topic, partition, offset))
                self._consumer.resume([TopicPartition(self.topic, partition)])
            except KafkaException:  # still paused, its end probed: the next round tries again
                log.warning("could not resume %s/%d", self.topic, partition, exc_info=True)
                with self._changed:
                    self._resume_at.setdefault(partition, offset)
                continue
            with self._changed:
                self._paused.discard(partition)
                self._kept.forget(partition)

    def keep_only(self, partitions: set[int]) -> None:
        """Keep the records of ``partitions`` only, from now on."""
        with self._changed:
            self._kept.keep_only(partitions)
            for partition in set(self._floors) - partitions:
                # No floor any more: read on from its last end, which keeps that end current.
                del self._floors[partition]
                if partition in self._paused:
                    self._resume_at[partition] = self._ends[partition]

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
        """Drop the kept records below ``offsets[partition]`` (those are folded already): the
        partition's floor."""
        with self._changed:
            for partition, offset in offsets.items():
                self._kept.forget_below(partition, offset)
                if not self._kept.keeps(partition):
                    continue  # a partition not kept has no floor: never paused
                self._floors[partition] = offset
                paused_end = self._ends.get(partition, offset)
                if partition in self._paused and paused_end - offset <= self._kept.limit:
                    self._resume_at[partition] = offset

    def ends(self, timeout: float = 30.0) -> dict[int, int]:
        """The end offset of every partition; waits until each has been read to its end once
        (or probed, paused). The ends of paused partitions are probed."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            self._probe_paused(max(0.0, min(remaining, PAUSED_PROBE_S)))
            with self._changed:
                if len(self._known) >= len(self.partitions):
                    return dict(self._ends)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(self.partitions) - self._known)
                    raise BrokerUnavailable(
                        f"could not read to the end of {self.topic} partitions {missing} "
                        f"within {timeout}s"
                    )
                # Woken by the tail; a partition it paused meanwhile is probed next round.
                self._changed.wait(min(remaining, 0.1))

    def _probe_paused(self, timeout: float) -> None:
        with self._changed:
            paused = set(self._paused)
        if not paused:
            return
        with self._changed:
            if self._probe is None:
                self._probe = ProbedEnds(self._bootstrap, self.topic, self.partitions)
            probe = self._probe
        try:
            probed = probe.ends(timeout)
        except BrokerUnavailable:  # their last ends stand, as a stalled tail's would
            return
        with self._changed:
            for p in paused:
                self._known.add(p)
                if probed[p] > self._ends.get(p, -1):
                    self._ends[p] = probed[p]

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
        if self._probe is not None:
            self._probe.close()


def _offset(message: Any) -> int:
    return message.offset()  # type: ignore[no-any-return]


def _tail_records(messages: list[Any] | None) -> list[TailRecord] | None:
    return None if messages is None else [TailRecord.from_message(m) for m in messages]
