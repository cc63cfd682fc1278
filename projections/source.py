"""A Spark streaming source over Kafka (Spark's Python Data Source API on confluent-kafka).

One Spark input partition per Kafka partition; offsets are ``{"<partition>": next offset}``.
Spark's ``format("kafka")`` needs a connector jar that pyspark does not ship; this source needs
nothing but confluent-kafka. The driver side learns end offsets from :class:`EndOffsets`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from foldstream.errors import BrokerUnavailable
from foldstream.kafka import consume_available, consumer_config
from foldstream.offsets import EndOffsets

SCHEMA = (
    "partition INT, offset BIGINT, key BINARY, value BINARY,"
    " headers ARRAY<STRUCT<name: STRING, value: BINARY>>"
)
ARROW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("name", pa.string()), ("value", pa.binary())]))),
    ]
)
ROWS_PER_ARROW_BATCH = 10_000
READ_TIMEOUT_S = 120.0

_consumers: dict[str, Consumer] = {}


def _consumer(bootstrap: str, fetch_wait_max_ms: int) -> Consumer:
    # Python workers are reused across tasks: one consumer per worker saves a connect per task.
    consumer = _consumers.get(bootstrap)
    if consumer is None:
        consumer = Consumer(consumer_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms))
        _consumers[bootstrap] = consumer
    return consumer


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets ``[start, end)`` of one Kafka partition."""

    partition: int
    start: int
    end: int


def read_range(
    bootstrap: str, topic: str, span: KafkaRange, *, fetch_wait_max_ms: int = 10
) -> Iterator[pa.RecordBatch]:
    """The records of ``span`` in offset order, as Arrow batches of :data:`ARROW_SCHEMA`."""
    consumer = _consumer(bootstrap, fetch_wait_max_ms)
    consumer.assign([TopicPartition(topic, span.partition, span.start)])
    columns: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
    deadline = time.monotonic() + READ_TIMEOUT_S
    position = span.start
    try:
        while position < span.end:
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"{topic}/{span.partition}: stuck at offset {position} of [{span.start}, "
                    f"{span.end}) for {READ_TIMEOUT_S}s"
                )
            for message in consume_available(consumer, ROWS_PER_ARROW_BATCH, 0.1):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # Gaps (compaction, transaction markers) end a range early.
                        position = max(position, message.offset())
                        continue
                    raise BrokerUnavailable(f"{topic}/{span.partition}: {error}")
                offset = message.offset()
                position = offset + 1
                if offset >= span.end:
                    break
                columns["partition"].append(span.partition)
                columns["offset"].append(offset)
                columns["key"].append(message.key())
                columns["value"].append(message.value())
                columns["headers"].append(
                    [{"name": n, "value": v} for n, v in (message.headers() or ())]
                )
            full = len(columns["offset"]) >= ROWS_PER_ARROW_BATCH
            if columns["offset"] and (full or position >= span.end):
                yield pa.RecordBatch.from_pydict(columns, schema=ARROW_SCHEMA)
                columns = {name: [] for name in ARROW_SCHEMA.names}
    finally:
        consumer.unassign()


class KafkaStreamReader(DataSourceStreamReader):
    """Driver and executor sides of the source. Options: see :class:`KafkaSource`.

    The partitions read are the ones listed in the ``owned`` file at the start of each
    micro-batch, with the offset to start from when a partition is new to the stream. The
    instance rewrites that file when partitions move, so the query never restarts.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.partitions_ = [int(p) for p in options["partitions"].split(",")]
        self.owned_path = Path(options["owned"])
        self.max_records = int(options.get("max_records_per_partition", "200000"))
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
            )
        return self._ends

    def initialOffset(self) -> dict[str, int]:
        return {}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        self._owned = read_owned(self.owned_path)
        begun = {p: int(start.get(str(p), first)) for p, first in self._owned.items()}
        if not begun:
            return {}
        # Waiting briefly for new data here saves Spark an empty poll-and-sleep round.
        ends = self._end_offsets().wait_beyond(begun, timeout=0.05)
        cap = None if isinstance(limit, ReadAllAvailable) else self.max_records
        latest = {}
        for p, first in begun.items():
            end = max(ends.get(p, 0), first)
            if cap is not None:
                end = min(end, first + cap)
            latest[str(p)] = end
        return latest

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        ranges = []
        for p in sorted(end, key=int):
            first = int(start.get(p, self._owned.get(int(p), end[p])))
            if end[p] > first:
                ranges.append(KafkaRange(int(p), first, end[p]))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(
            self.bootstrap, self.topic, partition, fetch_wait_max_ms=self.fetch_wait_max_ms
        )

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the sink stores source offsets with the state it writes."""

    def stop(self) -> None:
        if self._ends is not None:
            self._ends.close()
            self._ends = None


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


class KafkaSource(DataSource):
    """``spark.readStream.format("foldstream-kafka")`` with options ``bootstrap``, ``topic``,
    ``partitions`` (all of the topic's, comma-separated), ``owned`` (the path of the file
    naming the partitions to read, see :func:`write_owned`) and optionally
    ``max_records_per_partition`` and ``fetch_wait_max_ms``."""

    @classmethod
    def name(cls) -> str:
        return "foldstream-kafka"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(dict(self.options))
