"""Projection rebuild events/s: the Spark projection folding a whole events topic into empty
stores, beside a single-process plain confluent-kafka consumer running the same fold."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bench.procs import cpu_by_kind
from bench.workload import expected_on_hand, sku
from foldstream.examples.inventory import service
from foldstream.kafka import read_to_end
from foldstream.projections.chunks import records_of_messages
from foldstream.projections.fold import fold_partition
from foldstream.projections.runner import ProjectionRunner
from foldstream.settings import Settings
from foldstream.state import RocksDBReader, RocksDBWriter, partition_path
from foldstream.state.host import StoreHost

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SERVICE_PATH = "foldstream.examples.inventory:service"
STORE = "stock"


def reference_fold(
    bootstrap: str, topic: str, partitions: int, state_dir: Path, store: str = STORE
) -> dict[str, float]:
    """events/s (and per CPU-second) of a plain consumer: per poll batch and partition, the same
    ``fold_partition`` (decode, fold, one WriteBatch of values + source offset), no changelog."""
    projection = service.projection(store)
    writers = {
        p: RocksDBWriter(
            partition_path(state_dir, store, p),
            identity=f"{topic}/{p}",
            table_format=projection.table_format,
        )
        for p in range(partitions)
    }
    folded = 0
    cpu = time.process_time()
    started = time.perf_counter()
    for batch in read_to_end(bootstrap, topic, partitions):
        for partition, records in records_of_messages(batch).items():
            done = fold_partition(projection, writers[partition], records, None)
            folded += done[0] if done else 0
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    for writer in writers.values():
        writer.close()
    return {"events/s": folded / elapsed, "events/CPU-s": folded / cpu, "seconds": elapsed}


def spark_rebuild(
    spark: SparkSession,
    settings: Settings,
    partitions: int,
    store: str = STORE,
    *,
    cpu_roots: Sequence[int] = (),
) -> tuple[float, dict[str, float]]:
    """events/s of the projection from query start until every partition is folded (the JVM
    is already up); also Spark's own figures of the query. CPU is this process's tree and the
    trees of ``cpu_roots`` (a cluster's workers, whose executors run the tasks)."""
    handled: list[int] = []  # records, as each task reports them
    projection = service.projection(store)
    host = StoreHost(
        state_dir=settings.state_dir,
        on_task=lambda store, steps, records: handled.append(records),
        formats={store: projection.table_format},
    )
    host.start()
    for partition in range(partitions):
        host.open(store, partition, identity=f"{settings.events_topic}/{partition}", epoch=1)
    runner = ProjectionRunner(
        spark=spark,
        settings=settings,
        host=host,
        service_path=SERVICE_PATH,
        projections=[projection],
        partitions={settings.events_topic: partitions},
    )
    roots = [os.getpid(), *cpu_roots]
    cpu_before = _cpu_by_kind(roots)
    started = time.perf_counter()
    runner.start()
    runner.run({settings.events_topic: range(partitions)})
    query = runner.queries[store]
    try:
        query.processAllAvailable()  # returns once every offset the source knew is committed
        elapsed = time.perf_counter() - started
        progress = query.recentProgress
    finally:
        runner.stop()
        host.stop()
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in _cpu_by_kind(roots).items()}
    records = sum(handled)
    batches = [p for p in progress if p["numInputRows"]]
    spark_figures = {
        "seconds": elapsed,
        "events/CPU-s": records / sum(v for k, v in cpu.items() if k != "broker"),
        **{f"cpu s: {kind}": seconds for kind, seconds in sorted(cpu.items())},
        "micro-batches with data": len(batches),
        "records": records,
        "mean batch ms": sum(p["durationMs"]["triggerExecution"] for p in batches)
        / max(1, len(batches)),
    }
    return records / elapsed, spark_figures


def _cpu_by_kind(roots: Sequence[int]) -> dict[str, float]:
    """:func:`cpu_by_kind` summed over the trees of ``roots``."""
    total: dict[str, float] = {}
    for root in roots:
        for kind, seconds in cpu_by_kind(root).items():
            total[kind] = total.get(kind, 0.0) + seconds
    return total


def check_stock(
    state_dir: Path, partitions: int, keys: int, events: int, samples: int = 200
) -> None:
    """Raise unless sampled products hold the stock their events add up to."""
    from foldstream.kafka import partition_for

    readers = [RocksDBReader(partition_path(state_dir, STORE, p)) for p in range(partitions)]
    try:
        for key in random.sample(range(keys), min(samples, keys)):
            raw = sku(key).encode()
            value = readers[partition_for(raw, partitions)].get(raw)
            expected = f'{{"on_hand":{expected_on_hand(key, keys, events)}}}'.encode()
            if value != expected:
                raise AssertionError(f"{state_dir}: {raw!r} holds {value!r}, expected {expected!r}")
    finally:
        for reader in readers:
            reader.close()
