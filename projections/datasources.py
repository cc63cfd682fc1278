"""The Spark data sources foldstream registers, in the module Spark's planning workers load.

Spark plans a streaming query in Python workers of its own, which import the module of the
class they unpickle and are kept for reuse. This module does not import pyarrow (nor numpy,
which pyarrow imports), so a worker that only creates a source stays at half the memory; the
reading (:mod:`~foldstream.projections.source`) and folding
(:mod:`~foldstream.projections.fold`) code is imported by the workers that run it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader

#: The rows :class:`FoldSource` produces: one per Kafka partition a task advanced.
FOLD_SCHEMA = "partition INT, applied BIGINT, offset BIGINT"


class FoldSource(DataSource):
    """A projection as a source: ``spark.readStream.format("foldstream-fold")``.

    Options: ``bootstrap``, ``topic``, ``partitions`` (all of the topic's, comma-separated),
    ``owned`` (the path of the file naming the partitions to read, see
    :func:`~foldstream.projections.source.write_owned`), ``service`` (import path), ``stores``
    (the stores the query folds, as JSON: each one's ``store``, ``changelog_topic``,
    ``dead_letter_topic`` and ``forwards``,
    :func:`~foldstream.projections.query_groups.stores_option`), ``store_host`` and
    ``store_token`` (the :class:`~foldstream.state.host.StoreHost` holding the stores'
    partitions: address and hex key; "token" so that Spark redacts it), and
    optionally ``max_records_per_partition`` (a micro-batch's cap),
    ``fetch_wait_max_ms``, ``tasks`` (Spark tasks of a large micro-batch) and
    ``single_task_records`` (up to which a micro-batch is one task).

    Each task folds the records it reads into each store
    (:class:`~foldstream.projections.source.FoldStreamReader`) and yields a row of
    :data:`FOLD_SCHEMA` per partition it advanced, for a sink that needs no Python, such as
    ``writeStream.format("noop")``. Spark's ``numInputRows`` counts those rows; the records the
    tasks handled (folded, or skipped as applied already) are in the instance's
    ``foldstream_projection_records`` metric, as the tasks report them.
    """

    @classmethod
    def name(cls) -> str:
        return "foldstream-fold"

    def schema(self) -> str:
        return FOLD_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from foldstream.projections.source import FoldStreamReader

        return FoldStreamReader(dict(self.options))
