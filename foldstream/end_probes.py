"""What a topic's partitions hold, learnt when asked: their ends (:class:`ProbedEnds`), whether
a span of offsets holds records (:func:`holds_records`), whether recorded positions still lie
within them (:func:`positions_within`).

An end is what Kafka's ListOffsets answers (one request per leader for all partitions asked):
for a ``read_committed`` client, which every reader of records here is, the last stable offset
(below the first record of any open transaction: where a reader stops); else the high
watermark. Nothing is read. :class:`~foldstream.offsets.EndOffsets` reads every record of a
topic instead: what a projection's source needs (it keeps those records for its micro-batches),
a cost per record for a reader that wants the ends alone, such as the lag of this instance's
copies.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from foldstream.errors import BrokerUnavailable
from foldstream.kafka import consumer_config

log = logging.getLogger(__name__)

#: How long one probe (a ListOffsets request per leader) may take; a stop waits for it at most
#: that long. The partitions that did not answer keep their last ends.
PROBE_TIMEOUT_S = 2.0


class ProbedEnds:
    """``{partition: end offset}`` of ``topic``, probed when :meth:`ends` asks, by a thread of
    its own: a probe slower than a caller's wait still ends, for the next caller."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int]) -> None:
        self.topic = topic
        self.partitions = list(partitions)
        self._ends: dict[int, int] = {}
        self._started = 0  # probes started, and finished, whole or not
        self._finished_count = 0
        self._finished = threading.Condition()
        self._asked = threading.Event()
        self._stopping = threading.Event()
        # Never fetches: ListOffsets answers with its isolation level's end (the module's
        # docstring).
        self._consumer = Consumer(consumer_config(bootstrap))
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
                found = self._probe()
            except Exception:  # noqa: BLE001 - the next probe tries again; the last ends stand
                log.debug("probing the ends of %s", self.topic, exc_info=True)
            with self._finished:
                # Replaced whole: a reader that does not wait needs no lock.
                self._ends = {**self._ends, **found}
                self._finished_count += 1
                self._finished.notify_all()

    def _probe(self) -> dict[int, int]:
        """The ends the partitions' leaders answered within :data:`PROBE_TIMEOUT_S`."""
        try:
            reported = self._consumer.offsets_for_times(
                [TopicPartition(self.topic, p, OFFSET_END) for p in self.partitions],
                timeout=PROBE_TIMEOUT_S,
            )
        except KafkaException as error:
            raise BrokerUnavailable(f"asking the ends of {self.topic}: {error}") from error
        wanted = set(self.partitions)
        # Answers are untrusted: only the partitions asked for, at real offsets.
        return {
            tp.partition: int(tp.offset)
            for tp in reported
            if tp.error is None and tp.partition in wanted and tp.offset >= 0
        }

    def close(self) -> None:
        self._stopping.set()
        self._asked.set()  # wakes the thread to see it
        self._thread.join(timeout=PROBE_TIMEOUT_S + 1)
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


Position = tuple[str, int]
"""``(topic, partition)``."""


def positions_within(
    bootstrap: str, positions: dict[Position, int], *, timeout: float = 30.0
) -> dict[Position, bool]:
    """Whether each of ``positions`` (``{(topic, partition): offset}``, the next offset a
    reader would read) lies within its partition: at or before the partition's end.

    A position past the end is one recorded before its topic was deleted and created again (a
    broker that kept nothing restarted, a topic recreated, another cluster). The end compared
    with is the high watermark, not the last stable offset: the question is whether the log
    reaches the position, whatever is committed. A position below a partition's first offset
    (records deleted by retention) lies within.
    """
    found = {key: True for key, offset in positions.items() if offset <= 0}
    asked = {key: offset for key, offset in positions.items() if key not in found}
    if not asked:
        return found
    # ListOffsets only: this consumer reads no record (the module's docstring).
    consumer = Consumer(consumer_config(bootstrap, isolation="read_uncommitted"))
    try:
        reported = consumer.offsets_for_times(
            [TopicPartition(t, p, OFFSET_END) for t, p in asked], timeout=timeout
        )
    except KafkaException as error:
        raise BrokerUnavailable(f"asking the ends of {sorted(asked)}: {error}") from error
    finally:
        consumer.close()
    for answer in reported:
        key = (answer.topic, answer.partition)
        if key not in asked:
            continue
        if answer.error is not None or answer.offset < 0:
            raise BrokerUnavailable(
                f"the end of {key[0]}/{key[1]} is unknown ({answer.error}): check that the "
                "Kafka cluster is reachable and the topic exists"
            )
        found[key] = asked[key] <= answer.offset
    missing = sorted(set(positions) - set(found))
    if missing:
        raise BrokerUnavailable(f"no end was answered for {missing}")
    return found
