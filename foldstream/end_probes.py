"""What a topic's partitions hold, learnt when asked: their ends (:class:`ProbedEnds`), whether
a span of offsets holds records (:func:`holds_records`), whether recorded positions still lie
within them (:func:`positions_within`).

:class:`~foldstream.offsets.EndOffsets` reads every record of a topic to keep its ends current:
what a projection's source needs (it keeps those records for its micro-batches), a cost per
record for a reader that wants the ends alone, such as the lag of this instance's copies. A
probe here asks instead: the end the broker reports (one ListOffsets request for every
partition), then a fetch from there, because some brokers under-report the end (Tansu answers
the base offset of the last record batch + 1) while the high watermark a fetch is answered with
is right on every broker. So a probe reads one fetch answer of a
partition (at most ``fetch.message.max.bytes``), whatever the topic's traffic.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from foldstream.errors import BrokerUnavailable
from foldstream.kafka import BOUNDED_PREFETCH_KBYTES, consume_available, consumer_config

log = logging.getLogger(__name__)


class ProbedEnds:
    """``{partition: end offset}`` of ``topic``, read when :meth:`ends` is called."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: list[int], *, fetch_wait_max_ms: int = 10
    ) -> None:
        """``fetch_wait_max_ms``: how long the broker may hold a fetch at a partition's end
        before it answers that nothing more is there, which a probe waits for."""
        self.topic = topic
        self.partitions = list(partitions)
        # One probe at a time on the consumer; the last ends are replaced whole, so a reader
        # that does not probe needs no lock.
        self._probing = threading.Lock()
        self._ends: dict[int, int] = {}
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

    def ends(self, timeout: float = 30.0) -> dict[int, int]:
        """The end offset of every partition, probed now; the ends of the last probe when this
        one does not finish within ``timeout`` (or without probing, with a ``timeout`` of 0).

        Raises :class:`~foldstream.errors.BrokerUnavailable` while some partition's end was
        never read.
        """
        deadline = time.monotonic() + timeout
        if timeout > 0 and self._probing.acquire(timeout=timeout):
            try:
                self._ends = {**self._ends, **self._probe(deadline)}
            except BrokerUnavailable:
                log.debug("probing the ends of %s", self.topic, exc_info=True)
            finally:
                self._probing.release()
        ends = self._ends
        missing = sorted(set(self.partitions) - ends.keys())
        if missing:
            raise BrokerUnavailable(
                f"could not read to the end of {self.topic} partitions {missing} within "
                f"{timeout}s: check that the Kafka cluster is reachable and the topic exists"
            )
        return dict(ends)

    def _probe(self, deadline: float) -> dict[int, int]:
        """Each partition's end now: read from its reported end to its end."""
        try:
            reported = self._consumer.offsets_for_times(
                [TopicPartition(self.topic, p, OFFSET_END) for p in self.partitions],
                timeout=max(0.001, deadline - time.monotonic()),
            )
        except KafkaException as error:
            raise BrokerUnavailable(f"asking the ends of {self.topic}: {error}") from error
        refused = [f"{tp.partition}: {tp.error}" for tp in reported if tp.error is not None]
        if refused:
            raise BrokerUnavailable(f"asking the ends of {self.topic}: {'; '.join(refused)}")
        # A reported end is never past the true one: reading from it reaches the true one.
        self._consumer.assign(
            [TopicPartition(self.topic, tp.partition, max(tp.offset, 0)) for tp in reported]
        )
        try:
            return self._read_to_ends(deadline)
        finally:
            self._consumer.unassign()

    def _read_to_ends(self, deadline: float) -> dict[int, int]:
        """Each partition's end as the first fetch answer read from its reported end gives it:
        the high watermark that answer carries (right on every broker), or more, for records
        past it. Reading on to the end of a partition would chase its writers."""
        found: dict[int, int] = {}
        while len(found) < len(self.partitions):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(self.partitions) - found.keys())
                raise BrokerUnavailable(f"{self.topic} partitions {missing} did not answer")
            for message in consume_available(self._consumer, 10_000, min(remaining, 0.05)):
                partition = message.partition()
                if partition not in found:
                    found[partition] = max(self._answered(message), self._high(partition))
        return found

    def _answered(self, message: Any) -> int:
        """The offset after what ``message`` (a record or the end of its partition) shows."""
        error = message.error()
        if error is None:
            return int(message.offset()) + 1
        if error.code() == KafkaError._PARTITION_EOF:
            return int(message.offset())
        raise BrokerUnavailable(f"reading {self.topic}/{message.partition()}: {error}")

    def _high(self, partition: int) -> int:
        """The high watermark of the last fetch answer of ``partition`` (the last stable
        offset, reading committed records only); -1 before one."""
        _, high = self._consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), cached=True
        )
        return int(high)

    def close(self) -> None:
        with self._probing:
            self._consumer.close()


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
