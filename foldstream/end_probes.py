"""What a topic's partitions hold, learnt when asked: their ends (:class:`ProbedEnds`), whether
a span of offsets holds records (:func:`holds_records`), whether recorded positions still lie
within them (:func:`positions_within`).

:class:`~foldstream.offsets.EndOffsets` reads every record of a topic to keep its ends current:
what a projection's source needs (it keeps those records for its micro-batches), a cost per
record for a reader that wants the ends alone, such as the lag of this instance's copies. A
probe here asks instead: the end the broker reports (ListOffsets, one request per leader for
all partitions), then a read from there. Some brokers under-report the end (Tansu answers the
base offset of the last record batch + 1), so the read goes on to the end a reader can reach
(where the consumer reports the partition's end, which reading committed records only is the
last stable offset), or to the high watermark the first fetch answer carried, whichever comes
first: a probe reads about one fetch answer of a partition, and does not chase its writers.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from foldstream.errors import BrokerUnavailable
from foldstream.kafka import consume_available, consumer_config, end_reader_config

log = logging.getLogger(__name__)

#: How long one probe may take before the partitions that did not answer keep their last ends.
PROBE_TIMEOUT_S = 10.0
#: How long a probe waits for the reported ends (a stop waits for it at most that long).
LIST_OFFSETS_TIMEOUT_S = 2.0


class ProbedEnds:
    """``{partition: end offset}`` of ``topic``, probed when :meth:`ends` asks, by a thread of
    its own: a probe slower than a caller's wait still ends, for the next caller."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: list[int], *, fetch_wait_max_ms: int = 10
    ) -> None:
        """``fetch_wait_max_ms``: how long the broker may hold a fetch at a partition's end
        before it answers that nothing more is there, which a probe waits for."""
        self.topic = topic
        self.partitions = list(partitions)
        self._ends: dict[int, int] = {}
        self._started = 0  # probes started, and finished, whole or not
        self._finished_count = 0
        self._finished = threading.Condition()
        self._asked = threading.Event()
        self._stopping = threading.Event()
        self._consumer = Consumer(end_reader_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms))
        self._thread = threading.Thread(target=self._run, name=f"probe-{topic}", daemon=True)
        self._thread.start()

    def ask(self) -> int:
        """Start a probe (unless one is waiting to start) and return what :meth:`ends` waits
        for, as ``asked``: several topics' probes then run at once."""
        with self._finished:
            # The first probe to start from now on: one running may have started too early.
            first = self._started
            self._asked.set()
            return first

    def ends(self, timeout: float = 30.0, *, asked: int | None = None) -> dict[int, int]:
        """The end offset of every partition, probed now (or since :meth:`ask` returned
        ``asked``) if the probe answers within ``timeout``; else (or without asking for a
        probe, with a ``timeout`` of 0) as the last probes found them.

        Raises :class:`~foldstream.errors.BrokerUnavailable` while some partition's end was
        never found.
        """
        if timeout > 0:
            deadline = time.monotonic() + timeout
            first = self.ask() if asked is None else asked
            with self._finished:
                while self._finished_count <= first and (left := deadline - time.monotonic()) > 0:
                    self._finished.wait(left)
        ends = self._ends
        missing = sorted(set(self.partitions) - ends.keys())
        if missing:
            raise BrokerUnavailable(
                f"could not read to the end of {self.topic} partitions {missing} within "
                f"{timeout}s: check that the Kafka cluster is reachable and the topic exists"
            )
        return dict(ends)

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not self._asked.wait(0.5) or self._stopping.is_set():
                continue
            with self._finished:
                self._asked.clear()
                self._started += 1
            found: dict[int, int] = {}
            try:
                found = self._probe(time.monotonic() + PROBE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the next probe tries again; the last ends stand
                log.debug("probing the ends of %s", self.topic, exc_info=True)
            with self._finished:
                # Replaced whole: a reader that does not wait needs no lock.
                self._ends = {**self._ends, **found}
                self._finished_count += 1
                self._finished.notify_all()

    def _probe(self, deadline: float) -> dict[int, int]:
        """The ends of the partitions that answered by ``deadline``, read from their reported
        ends (the module's docstring)."""
        try:
            reported = self._consumer.offsets_for_times(
                [TopicPartition(self.topic, p, OFFSET_END) for p in self.partitions],
                timeout=max(0.001, min(LIST_OFFSETS_TIMEOUT_S, deadline - time.monotonic())),
            )
        except KafkaException as error:
            raise BrokerUnavailable(f"asking the ends of {self.topic}: {error}") from error
        # A reported end is never past the true one: reading from it reaches the true one.
        answered = [tp for tp in reported if tp.error is None]
        self._consumer.assign(
            [TopicPartition(self.topic, tp.partition, max(tp.offset, 0)) for tp in answered]
        )
        try:
            return self._read_to_ends({tp.partition for tp in answered}, deadline)
        finally:
            self._consumer.unassign()

    def _read_to_ends(self, partitions: set[int], deadline: float) -> dict[int, int]:
        found: dict[int, int] = {}
        targets: dict[int, int] = {}
        while (
            len(found) < len(partitions)
            and (left := deadline - time.monotonic()) > 0
            and not self._stopping.is_set()
        ):
            for message in consume_available(self._consumer, 10_000, min(left, 0.05)):
                partition = message.partition()
                if partition in found:
                    continue
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise BrokerUnavailable(f"reading {self.topic}/{partition}: {error}")
                if error is not None:  # the end a reader reaches
                    found[partition] = int(message.offset())
                    continue
                # The first answer's high watermark, once: records up to it that a reader is
                # given lie within the end. Past it, the read would chase the writers.
                if partition not in targets:
                    targets[partition] = self._high(partition)
                target = targets[partition]
                if target < 0:  # no watermark known (never seen): read to the end
                    continue
                if message.offset() + 1 >= target:
                    found[partition] = int(message.offset()) + 1
        return found

    def _high(self, partition: int) -> int:
        """The high watermark of the last fetch answer of ``partition``."""
        _, high = self._consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), cached=True
        )
        return int(high)

    def close(self) -> None:
        self._stopping.set()
        self._asked.set()  # wakes the thread to see it
        self._thread.join(timeout=LIST_OFFSETS_TIMEOUT_S + 1)
        self._consumer.close()


def holds_records(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int | None,
    *,
    timeout: float = 5.0,
) -> bool:
    """Whether a consumer finds any record at offsets ``[start, end)`` of ``partition`` (``end``
    None: up to the partition's end).

    Some offsets hold no record a consumer is given: transaction markers (every committed
    transaction ends with one), records of aborted transactions, compacted-away records. So a
    store that applied everything up to ``start`` is caught up with ``end`` when this is False,
    although ``end - start > 0``.
    """
    if end is not None and end <= start:
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
                return end is None or offset < end
            if end is None or offset >= end:
                return False  # the partition's end
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
