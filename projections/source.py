"""The projection's Spark streaming source over Kafka (Spark's Python Data Source API on
confluent-kafka): planning micro-batches, fetching their records, and the reader whose tasks
fold them (:class:`FoldStreamReader`, folding with :mod:`~foldstream.projections.fold`).

Offsets are ``{"<partition>": next offset}``. A micro-batch becomes as many Spark tasks as
there are cores (option ``tasks``), each reading whole Kafka partitions, or a single task when
it is small (``single_task_records``): large batches (rebuilds) use every core, small ones
(steady state) pay the per-task cost once.
Spark's ``format("kafka")`` needs a connector jar that pyspark does not ship; reading here needs
nothing but confluent-kafka. The driver side learns end offsets from :class:`EndOffsets`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from foldstream.errors import BrokerUnavailable
from foldstream.kafka import BOUNDED_PREFETCH_KBYTES, consume_available, consumer_config
from foldstream.kafka_client import install_from_options
from foldstream.offsets import EndOffsets, TailRecord

#: Messages a task's fetch hands to the fold at most at once.
MESSAGES_PER_FETCH = 10_000
#: Bytes of keys and values a micro-batch planned with its records may carry in its task.
MAX_PLANNED_BYTES = 4 << 20
READ_TIMEOUT_S = 120.0
#: How long an idle micro-batch trigger waits for new records before Spark polls again.
IDLE_WAIT_S = 0.5

_consumers: dict[str, Consumer] = {}


def _consumer(bootstrap: str, fetch_wait_max_ms: int) -> Consumer:
    # Python workers are reused across tasks: one consumer per worker saves a connect per task.
    consumer = _consumers.get(bootstrap)
    if consumer is None:
        config = consumer_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms)
        # bounded: one such consumer lives in every Python worker
        config["queued.max.messages.kbytes"] = BOUNDED_PREFETCH_KBYTES
        consumer = Consumer(config)
        _consumers[bootstrap] = consumer
    return consumer


@dataclass(frozen=True)
class KafkaRange:
    """Offsets ``[start, end)`` of one Kafka partition."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


Planned = tuple[tuple[int, tuple[TailRecord, ...]], ...]
"""The records a micro-batch was planned with: ``((partition, records), ...)``."""


@dataclass(frozen=True)
class KafkaRanges(InputPartition):
    """The ranges one Spark task reads: whole Kafka partitions, never a part of one, so that
    each partition is folded by one task in offset order. ``planned``, when given, are their
    records, read by the driver's tail while it planned the micro-batch: the task reads nothing
    from the broker then."""

    spans: tuple[KafkaRange, ...]
    planned: Planned | None = None


def plan_tasks(spans: list[KafkaRange], tasks: int, single_task_records: int) -> list[KafkaRanges]:
    """Group ``spans`` into at most ``tasks`` Spark tasks of about equal record counts.

    Small micro-batches (up to ``single_task_records`` records in all) go to one task: each task
    costs Python round trips and a store open per partition, which dominate small batches.
    """
    spans = [s for s in spans if s.size > 0]
    if not spans:
        return []
    count = 1 if sum(s.size for s in spans) <= single_task_records else max(1, tasks)
    groups: list[list[KafkaRange]] = [[] for _ in range(min(count, len(spans)))]
    loads = [0] * len(groups)
    for span in sorted(spans, key=lambda s: -s.size):
        lightest = loads.index(min(loads))
        groups[lightest].append(span)
        loads[lightest] += span.size
    return [KafkaRanges(tuple(sorted(g, key=lambda s: s.partition))) for g in groups]


def read_messages(
    bootstrap: str,
    topic: str,
    spans: Sequence[KafkaRange],
    *,
    fetch_wait_max_ms: int = 10,
    max_messages: int = MESSAGES_PER_FETCH,
) -> Iterator[list[Any]]:
    """The records of ``spans`` as lists of up to ``max_messages`` confluent-kafka messages,
    each partition's in offset order (one consumer fetches all the spans' partitions at
    once)."""
    consumer = _consumer(bootstrap, fetch_wait_max_ms)
    ends = {s.partition: s.end for s in spans if s.size > 0}
    positions = {s.partition: s.start for s in spans if s.size > 0}
    consumer.assign([TopicPartition(topic, p, positions[p]) for p in ends])
    kept: list[Any] = []
    paused: list[TopicPartition] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while any(positions[p] < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                stuck = {p: (positions[p], end) for p, end in ends.items() if positions[p] < end}
                raise BrokerUnavailable(
                    f"{topic}: partitions stuck at (offset, end) {stuck} for {READ_TIMEOUT_S}s"
                )
            for message in consume_available(consumer, max_messages - len(kept), 0.1):
                error = message.error()
                partition = message.partition()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # Gaps (compaction, transaction markers) end a range early.
                        positions[partition] = max(positions[partition], message.offset())
                        continue
                    raise BrokerUnavailable(f"{topic}/{partition}: {error}")
                offset = message.offset()
                if offset >= ends[partition]:
                    positions[partition] = max(positions[partition], offset)
                    continue
                positions[partition] = offset + 1
                kept.append(message)
                if offset + 1 == ends[partition]:
                    # Done with this partition: fetch no further records of it.
                    paused.append(TopicPartition(topic, partition))
                    consumer.pause(paused[-1:])
            if len(kept) >= max_messages:
                yield kept
                kept = []
        if kept:
            yield kept
    finally:
        if paused:
            consumer.resume(paused)  # the consumer is reused: leave no partition paused
        consumer.unassign()


class KafkaStreamReader(DataSourceStreamReader):
    """Plans micro-batches over Kafka (the driver side); :class:`FoldStreamReader` reads them.
    Options (the planning ones): see :class:`~foldstream.projections.datasources.FoldSource`.

    The partitions read are the ones listed in the ``owned`` file at the start of each
    micro-batch, with the offset to start from when a partition is new to the stream. The
    instance rewrites that file when partitions move, so the query never restarts.
    """

    def __init__(self, options: dict[str, str]) -> None:
        # This planning worker's Kafka clients get the instance's client properties (security);
        # a task's worker installs them in read().
        install_from_options(options)
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.partitions_ = [int(p) for p in options["partitions"].split(",")]
        self.owned_path = Path(options["owned"])
        # Bounds a micro-batch (Settings.batch_records_per_partition).
        self.max_records = int(options.get("max_records_per_partition", "500000"))
        self.tasks = int(options.get("tasks", "2"))
        self.single_task_records = int(options.get("single_task_records", "5000"))
        self.fetch_wait_max_ms = int(options.get("fetch_wait_max_ms", "10"))
        self._ends: EndOffsets | None = None
        self._owned: dict[int, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_ends"} | {"_ends": None}

    def _end_offsets(self) -> EndOffsets:
        if self._ends is None:
            self._ends = EndOffsets(
                self.bootstrap,
                self.topic,
                self.partitions_,
                fetch_wait_max_ms=self.fetch_wait_max_ms,
                # A micro-batch small enough for one task is planned with its records.
                keep_records=self.single_task_records,
            )
        return self._ends

    def initialOffset(self) -> dict[str, int]:
        return {}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        self._owned = read_owned(self.owned_path)
        begun = {p: int(start.get(str(p), first)) for p, first in self._owned.items()}
        if not begun:
            if self._ends is not None:
                self._ends.keep_only(set())
            return {}
        tail = self._end_offsets()
        tail.keep_only(set(begun))
        tail.forget_below(begun)
        ends = self._wait_for_data(begun)
        cap = None if isinstance(limit, ReadAllAvailable) else self.max_records
        latest = {}
        for p, first in begun.items():
            end = max(ends.get(p, 0), first)
            if cap is not None:
                end = min(end, first + cap)
            latest[str(p)] = end
        return latest

    def _wait_for_data(self, begun: dict[int, int]) -> dict[int, int]:
        """The ends, once one passes ``begun``, the owned-partitions file changes, or
        :data:`IDLE_WAIT_S` passed.

        Each empty round costs the JVM and this Python process a round trip: an idle query
        waiting here instead of polling uses a fraction of the CPU, and new data still starts
        a micro-batch at once (the tailing consumer wakes the wait).
        """
        deadline = time.monotonic() + IDLE_WAIT_S
        owned_at = _mtime(self.owned_path)
        while True:
            remaining = deadline - time.monotonic()
            ends = self._end_offsets().wait_beyond(begun, timeout=max(0.0, min(0.05, remaining)))
            if (
                remaining <= 0
                or any(ends.get(p, 0) > o for p, o in begun.items())
                or _mtime(self.owned_path) != owned_at
            ):
                return ends

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        spans = []
        for p in sorted(end, key=int):
            first = int(start.get(p, self._owned.get(int(p), end[p])))
            if end[p] > first:
                spans.append(KafkaRange(int(p), first, end[p]))
        tasks = plan_tasks(spans, self.tasks, self.single_task_records)
        if len(tasks) == 1 and self._ends is not None:
            planned = self._tail_records(tasks[0].spans)
            if planned is not None:
                return [KafkaRanges(tasks[0].spans, planned)]
        return list(tasks)

    def _tail_records(self, spans: Sequence[KafkaRange]) -> Planned | None:
        """The records of ``spans`` the tail kept, or None if it lacks any."""
        assert self._ends is not None
        planned = []
        size = 0
        for span in spans:
            kept = self._ends.records(span.partition, span.start, span.end)
            if kept is None:
                return None
            size += sum(len(r.key or b"") + len(r.value or b"") for r in kept)
            if size > MAX_PLANNED_BYTES:
                return None
            planned.append((span.partition, tuple(kept)))
        return tuple(planned)

    def commit(self, end: dict[str, int]) -> None:
        """Forget the tail's records below ``end``: the fold stored them with the state (it
        stores source offsets with the state it writes, so nothing else is to do)."""
        if self._ends is not None:
            self._ends.forget_below({int(p): offset for p, offset in end.items()})

    def stop(self) -> None:
        if self._ends is not None:
            self._ends.close()
            self._ends = None


class FoldStreamReader(KafkaStreamReader):
    """The stream reader of :class:`~foldstream.projections.datasources.FoldSource`: plans
    micro-batches as :class:`KafkaStreamReader` does; each task folds its records
    (:func:`~foldstream.projections.fold_task.fold_task`) and yields ``(partition, records applied,
    last offset)`` per partition it advanced."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.fold_options = options

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int]]:
        # Imported here: the fold's modules (the store host, rocksdict, the changelog) are for
        # the task workers, which Spark forks from a daemon that has them loaded already, not
        # for the planning workers that load this module.
        from foldstream.projections.chunks import records_of_messages, records_of_planned
        from foldstream.projections.fold_task import fold_task
        from foldstream.projections.worker import arrow_without_pandas

        assert isinstance(partition, KafkaRanges)
        install_from_options(self.fold_options)
        arrow_without_pandas()  # pyspark turns the rows yielded into Arrow
        if partition.planned is not None:
            applied = fold_task(self.fold_options, [partition.planned], records_of_planned)
        else:
            fetched = read_messages(
                self.bootstrap,
                self.topic,
                partition.spans,
                fetch_wait_max_ms=self.fetch_wait_max_ms,
            )
            applied = fold_task(self.fold_options, fetched, records_of_messages)
        for kafka_partition, (count, offset) in sorted(applied.items()):
            yield kafka_partition, count, offset


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def read_owned(path: Path) -> dict[int, int]:
    """``{partition: offset to start from}`` of the partitions this instance processes."""
    try:
        return {int(p): int(o) for p, o in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def write_owned(path: Path, owned: dict[int, int]) -> None:
    """Atomically replace the owned-partitions file read at each micro-batch."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({str(p): o for p, o in sorted(owned.items())}))
    os.replace(scratch, path)
