"""The Spark data sources foldstream registers, in the module Spark's planning workers load.

Spark plans a streaming query in Python workers of their own: one creates the source and the
sink, one the sink's writer, one runs the writer's commit at every micro-batch. Each imports the
module of the class it unpickles, and is kept for reuse. This module does not import pyarrow
(nor numpy, which pyarrow imports), so those workers stay at about 40 MB instead of 80 MB; the
reading (:mod:`~foldstream.projections.source`) and folding
(:mod:`~foldstream.projections.sink`) code is imported by the workers that run it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    WriterCommitMessage,
)

if TYPE_CHECKING:
    import pyarrow as pa

#: The rows :class:`KafkaSource` produces, one per Kafka record (headers encoded in one value).
SCHEMA = "partition INT, offset BIGINT, key BINARY, value BINARY, headers BINARY"


class KafkaSource(DataSource):
    """``spark.readStream.format("foldstream-kafka")`` with options ``bootstrap``, ``topic``,
    ``partitions`` (all of the topic's, comma-separated), ``owned`` (the path of the file
    naming the partitions to read, see :func:`~foldstream.projections.source.write_owned`) and
    optionally ``max_records_per_partition``, ``fetch_wait_max_ms``, ``tasks`` and
    ``single_task_records``."""

    @classmethod
    def name(cls) -> str:
        return "foldstream-kafka"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from foldstream.projections.source import KafkaStreamReader

        return KafkaStreamReader(dict(self.options))


@dataclass
class FoldResult(WriterCommitMessage):
    """What one task applied: ``{partition: (records applied, last offset)}``."""

    applied: dict[int, tuple[int, int]] = field(default_factory=dict)


class StoreStreamWriter(DataSourceStreamArrowWriter):
    """Executor side of :class:`StoreSink`: folds each task's records with
    :func:`~foldstream.projections.sink.fold_task`."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FoldResult:
        from foldstream.projections.sink import fold_task

        return FoldResult(fold_task(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task committed its partitions with their offsets."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: committed partitions are consistent, the rest is replayed."""


class StoreSink(DataSource):
    """``writeStream.format("foldstream-store")`` with options ``service`` (import path),
    ``store``, ``store_host`` and ``store_token`` (the :class:`~foldstream.state.host.StoreHost`
    holding its partitions: address and hex key; "token" so that Spark redacts it), ``bootstrap``
    and ``changelog_topic``."""

    @classmethod
    def name(cls) -> str:
        return "foldstream-store"

    def streamWriter(self, schema: Any, overwrite: bool) -> StoreStreamWriter:
        return StoreStreamWriter(dict(self.options))
