"""Projection rebuild events/s on a 2-worker Spark standalone cluster, beside ``local[2]``: the
same events, rebuilt into empty stores in the same run.

The cluster is a master and two workers (1 core, 1 GB each) started from the pyspark
installation (:mod:`foldstream.testing.spark_cluster`): each worker runs an executor JVM of its
own, whose Python workers fold through this process's store host, as an instance's do. The
driver is this process's JVM, already up from ``local[2]``: a new SparkContext on the cluster.
CPU is this process's tree (the driver) plus each worker's (worker JVM, executor JVM, Python
workers).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bench import rebuild
from bench.report import Figure
from bench.run import BenchRun
from foldstream.settings import Settings
from foldstream.spark import spark_session, worker_python
from foldstream.testing.spark_cluster import SparkStandaloneCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WORKERS = 2
#: How long the cluster's executors may take to register once the session started.
EXECUTORS_TIMEOUT_S = 120.0


@contextlib.contextmanager
def _python_for(master: str) -> Iterator[None]:
    """``PYSPARK_PYTHON`` as an instance on ``master`` has it, while a session starts: the
    ``local[2]`` session before set it to its own choice (the local wrapper)."""
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = worker_python(master)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = before


def _session(cluster: SparkStandaloneCluster) -> SparkSession:
    """A session on ``cluster``, once an executor runs on each worker."""
    with _python_for(cluster.master_url):
        spark = spark_session(cluster.master_url, "bench-cluster", conf=cluster.session_conf)
    deadline = time.monotonic() + EXECUTORS_TIMEOUT_S
    tracker = spark.sparkContext.statusTracker()
    # The driver is among the executors the tracker lists.
    while len(tracker.getExecutorInfos()) < WORKERS + 1:
        if time.monotonic() > deadline:
            spark.stop()
            raise TimeoutError(f"{WORKERS} executors not registered in {EXECUTORS_TIMEOUT_S}s")
        time.sleep(0.1)
    return spark


def cluster_rebuild_figure(
    run: BenchRun, settings: Settings, partitions: int, local: Figure
) -> Figure:
    """The rebuild of ``settings``' events topic on a 2-worker cluster, beside ``local``: the
    ``local[2]`` rebuild figure of the same events in this run."""
    on_cluster = settings.with_(state_dir=run.tmp / "rebuild-cluster")
    with SparkStandaloneCluster(root=run.tmp / "spark-standalone", workers=WORKERS) as cluster:
        started = time.perf_counter()
        spark = run.step(
            f"starting a session on a {WORKERS}-worker standalone cluster",
            lambda: _session(cluster),
        )
        session_start = time.perf_counter() - started
        try:
            rate, figures = run.step(
                f"projection rebuild on the {WORKERS}-worker cluster",
                lambda: rebuild.spark_rebuild(
                    spark,
                    on_cluster,
                    partitions,
                    cpu_roots=[w.pid for w in cluster.workers if w.pid is not None],
                ),
            )
        finally:
            spark.stop()
    events, keys = run.size["events"], run.size["keys"]
    rebuild.check_stock(on_cluster.state_dir, partitions, keys, events)
    local_cpu = local.details.get("events/CPU-s", 0.0)
    return Figure(
        f"projection rebuild events/s on a {WORKERS}-worker standalone Spark cluster",
        rate,
        "ev/s",
        local.value,
        "local[2], same events, same run",
        note=(
            f"info: {WORKERS} workers x 1 core, an executor JVM each (512m); from query start "
            f"(executors up; the session and executors took {session_start:.1f}s); CPU "
            f"(driver, workers, executors, their Python): {figures['events/CPU-s']:,.0f} "
            f"ev/CPU-s vs local[2] {local_cpu:,.0f}; values checked against the events"
        ),
        details={**figures, "session and executors start s": session_start},
    )
