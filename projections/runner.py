"""Runs a service's projections as Spark Structured Streaming queries.

Source offsets live with the state in RocksDB, so Spark's checkpoint is scratch space: every
start resumes from what the stores hold, which is exact even if a checkpoint is lost or stale.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from foldstream.projections.projection import Projection
from foldstream.projections.sink import open_writer
from foldstream.state import partition_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from foldstream.settings import Settings

log = logging.getLogger(__name__)


def stored_offsets(
    state_dir: Path, store: str, topic: str, partitions: Sequence[int]
) -> dict[int, int]:
    """``{partition: next source offset}`` from the state of each partition of ``store``."""
    starts = {}
    for partition in partitions:
        writer = open_writer(partition_path(state_dir, store, partition), f"{topic}/{partition}")
        try:
            starts[partition] = writer.next_offset()
        finally:
            writer.close()
    return starts


class ProjectionRunner:
    """Starts one streaming query per projection; :meth:`stop` stops them all."""

    def __init__(
        self,
        *,
        spark: SparkSession,
        settings: Settings,
        service_path: str,
        projections: Sequence[Projection],
        partitions: dict[str, int],
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.service_path = service_path
        self.projections = list(projections)
        self.partitions = partitions  # {topic: partition count}
        self.queries: dict[str, StreamingQuery] = {}

    def start(self) -> None:
        for projection in self.projections:
            self.queries[projection.store] = self._start(projection)

    def _start(self, projection: Projection) -> StreamingQuery:
        settings = self.settings
        topic = projection.source_topic(settings.events_topic)
        partitions = list(range(self.partitions[topic]))
        starts = stored_offsets(settings.state_dir, projection.store, topic, partitions)
        scratch = settings.state_dir / "spark" / projection.store
        shutil.rmtree(scratch, ignore_errors=True)
        log.info("projection %s starts from %s", projection.store, starts)
        stream = (
            self.spark.readStream.format("foldstream-kafka")
            .option("bootstrap", settings.bootstrap_servers)
            .option("topic", topic)
            .option("partitions", ",".join(map(str, partitions)))
            .option("start_offsets", json.dumps({str(p): o for p, o in starts.items()}))
            .option("fetch_wait_max_ms", str(settings.fetch_wait_max_ms))
            # Large micro-batches (rebuilds) are split into one task per core.
            .option("tasks", str(self.spark.sparkContext.defaultParallelism))
            .load()
        )
        return (
            stream.writeStream.format("foldstream-store")
            .queryName(f"{settings.service}.{projection.store}")
            .option("checkpointLocation", str(scratch / uuid.uuid4().hex))
            .option("service", self.service_path)
            .option("store", projection.store)
            .option("state_dir", str(settings.state_dir.resolve()))
            .option("bootstrap", settings.bootstrap_servers)
            .option("source_topic", topic)
            .option("changelog_topic", settings.changelog_topic(projection.store))
            .start()
        )

    def failure(self) -> str | None:
        """The error of the first query that stopped with one, or None while all run."""
        for store, query in self.queries.items():
            error = query.exception()
            if error is not None:
                return f"projection {store!r} failed: {error}"
        return None

    def stop(self) -> None:
        for query in self.queries.values():
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - stopping must go on for the other queries
                log.exception("stopping %s", query.name)
        self.queries.clear()
