"""Runs a service's projections as Spark Structured Streaming queries.

Source offsets live with the state in RocksDB, so Spark's checkpoint is scratch space: every
start resumes from what the stores hold, which is exact even if a checkpoint is lost or stale.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from foldstream.kafka_client import spark_options
from foldstream.projections.projection import Projection
from foldstream.projections.source import write_owned
from foldstream.state.host import StoreHost

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from foldstream.settings import Settings

log = logging.getLogger(__name__)

#: Restarts of a failed query allowed within :data:`RESTART_WINDOW_S`; past them the failure
#: is reported (readiness) and the query stays stopped.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
SUPERVISE_INTERVAL_S = 0.5


def query_name(service: str, store: str) -> str:
    """The name of the streaming query of ``service``'s projection into ``store``."""
    return f"{service}.{store}"


def stored_offsets(
    host: StoreHost, store: str, topic: str, partitions: Sequence[int]
) -> dict[int, int]:
    """``{partition: next source offset}`` from the state of each partition of ``store`` that
    ``host`` holds; the others (released meanwhile) are left out."""
    starts = {}
    for partition in partitions:
        offset = host.next_offset(store, partition)
        if offset is None:
            log.info("projection %s: partition %d of %s is not held here", store, partition, topic)
        else:
            starts[partition] = offset
    return starts


class ProjectionRunner:
    """Runs one streaming query per projection over the source partitions this instance owns.

    Queries run for the instance's whole life; :meth:`run` changes the partitions they read
    through each query's owned-partitions file (read at every micro-batch). When it returns,
    no micro-batch that may still write a partition no longer owned is running. The stores'
    partitions are written through ``host``; the caller holds them there before giving them to
    :meth:`run` and releases them after taking them away (a partition not held is not read).
    """

    def __init__(
        self,
        *,
        spark: SparkSession,
        settings: Settings,
        host: StoreHost,
        service_path: str,
        projections: Sequence[Projection],
        partitions: Mapping[str, int],
        quiesce_timeout_s: float = 10.0,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.host = host
        self.service_path = service_path
        self.projections = list(projections)
        self.partitions = dict(partitions)  # {topic: partition count}
        self.quiesce_timeout_s = quiesce_timeout_s
        self.start_timeout_s = start_timeout_s
        self.queries: dict[str, StreamingQuery] = {}
        self._owned: dict[str, dict[int, int]] = {}
        self._restarts: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(
            target=self._supervise_loop, name="projection-supervisor", daemon=True
        )

    def _owned_path(self, store: str) -> Path:
        return self.settings.state_dir / "spark" / f"{store}.owned.json"

    def start(self) -> None:
        """Start every projection's query, reading no partition until :meth:`run` says so."""
        for n, projection in enumerate(self.projections):
            if n > 0:
                self._await_first_trigger(self.queries[self.projections[n - 1].store])
            write_owned(self._owned_path(projection.store), {})
            self._owned[projection.store] = {}
            self.queries[projection.store] = self._start(projection)
        self._supervisor.start()

    def _await_first_trigger(self, query: StreamingQuery) -> None:
        """Wait (up to :attr:`start_timeout_s`) until ``query`` has run its first trigger, before
        starting the next query.

        Spark plans a query's Python source in Python workers that it keeps for reuse, one per
        planning step in progress: queries started together each get their own (40-50 MB
        apiece, idle once the queries run), queries started one after another share them.
        Measured on a 1M-key instance (then with a Python sink, four kinds of planning
        workers): peak PSS 1.59 -> 1.46 GB, same ready time.
        """
        deadline = time.monotonic() + self.start_timeout_s
        while query.lastProgress is None and query.isActive and time.monotonic() < deadline:
            time.sleep(0.01)

    def run(self, owned: Mapping[str, Iterable[int]]) -> None:
        """Make each projection process exactly the ``owned`` partitions of its source topic."""
        with self._lock:
            for projection in self.projections:
                store = projection.store
                topic = projection.source_topic(self.settings.events_topic)
                wanted = set(owned.get(topic, ()))
                current = self._owned[store]
                if wanted == set(current):
                    continue
                gained = sorted(wanted - set(current))
                starts = stored_offsets(self.host, store, topic, gained)
                log.info("projection %s processes %s (new: %s)", store, sorted(wanted), starts)
                updated = {p: o for p, o in current.items() if p in wanted} | starts
                write_owned(self._owned_path(store), updated)
                self._owned[store] = updated
                if set(current) - wanted:
                    self._quiesce(store)

    def _quiesce(self, store: str) -> None:
        # A micro-batch planned before the file changed may still write the dropped partitions:
        # wait until the trigger running now (if any) has finished.
        query = self.queries[store]
        progress = query.lastProgress
        seen = progress["batchId"] if progress else -1
        deadline = time.monotonic() + self.quiesce_timeout_s
        while time.monotonic() < deadline and query.isActive:
            if not query.status["isTriggerActive"]:
                return
            progress = query.lastProgress
            if progress and progress["batchId"] > seen:
                return
            time.sleep(0.01)

    def _start(self, projection: Projection) -> StreamingQuery:
        settings = self.settings
        # Spark resolves the Python data sources through the calling thread's active session,
        # which a thread other than the one that built the session (the supervisor) lacks.
        jvm_session = type(self.spark)._get_j_spark_session_class(self.spark._jvm)
        jvm_session.setActiveSession(self.spark._jsparkSession)
        topic = projection.source_topic(settings.events_topic)
        scratch = settings.state_dir / "spark" / projection.store
        shutil.rmtree(scratch, ignore_errors=True)
        folded = (
            self.spark.readStream.format("foldstream-fold")
            .option("bootstrap", settings.bootstrap_servers)
            .option("topic", topic)
            .option("partitions", ",".join(map(str, range(self.partitions[topic]))))
            .option("owned", str(self._owned_path(projection.store).resolve()))
            .option("fetch_wait_max_ms", str(settings.fetch_wait_max_ms))
            # Large micro-batches (rebuilds) are split into one task per core.
            .option("tasks", str(self.spark.sparkContext.defaultParallelism))
            .option("service", self.service_path)
            .option("store", projection.store)
            .option("store_host", self.host.address)
            .option("store_token", self.host.authkey.hex())
            .option("changelog_topic", settings.changelog_topic(projection.store))
            # The tasks' Kafka clients get the instance's client properties (security).
            .options(**spark_options())
            .load()
        )
        # The tasks fold as they read: what they yield (a row per partition) is dropped by
        # the JVM, with no Python sink and its second Python worker per task.
        return (
            folded.writeStream.format("noop")
            .queryName(query_name(settings.service, projection.store))
            .option("checkpointLocation", str(scratch / uuid.uuid4().hex))
            .start()
        )

    def _supervise_loop(self) -> None:
        while not self._stopping.wait(SUPERVISE_INTERVAL_S):
            try:
                self.restart_failed()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("supervising the projections")

    def restart_failed(self) -> None:
        """Restart each query that stopped with an error (a Spark task failing past its
        attempts), from the offsets its stores hold, while its restart budget lasts."""
        with self._lock:
            for projection in self.projections:
                store = projection.store
                if self._stopping.is_set():
                    return
                error = self.queries[store].exception()
                if error is None:
                    continue
                recent = self._recent_restarts(store)
                if len(recent) >= MAX_RESTARTS:
                    continue  # reported by failure()
                self._restarts[store] = [*recent, time.monotonic()]
                topic = projection.source_topic(self.settings.events_topic)
                # A task of the failed query still writing can only move an offset forward:
                # the new query's tasks skip what the stores hold by then.
                starts = stored_offsets(self.host, store, topic, sorted(self._owned[store]))
                log.warning(
                    "projection %s failed (%s); restart %d of %d within %.0fs from %s",
                    store,
                    _error_summary(error),
                    len(recent) + 1,
                    MAX_RESTARTS,
                    RESTART_WINDOW_S,
                    starts,
                )
                write_owned(self._owned_path(store), starts)
                self._owned[store] = starts
                self.queries[store] = self._start(projection)

    def _recent_restarts(self, store: str) -> list[float]:
        now = time.monotonic()
        return [t for t in self._restarts.get(store, []) if now - t < RESTART_WINDOW_S]

    def failure(self) -> str | None:
        """The error of the first query that failed past its restarts, or None."""
        for store, query in self.queries.items():
            error = query.exception()
            restarts = self._recent_restarts(store)
            if error is not None and len(restarts) >= MAX_RESTARTS:
                return (
                    f"projection {store!r} failed {len(restarts) + 1} times within "
                    f"{RESTART_WINDOW_S:.0f}s, last with: {_error_summary(error)}"
                )
        return None

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor.is_alive():
            self._supervisor.join()
        for query in self.queries.values():
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - stopping must go on for the other queries
                log.exception("stopping %s", query.name)
        self.queries.clear()


_PYTHON_ERROR = re.compile(r"^\w[\w.]*(?:Error|Exception): .*$", re.MULTILINE)


def _error_summary(error: object) -> str:
    """The Python error inside a Spark error (else its first line), without stack traces."""
    text = str(error).strip()
    raised = _PYTHON_ERROR.search(text)
    if raised is not None:
        return raised.group(0)
    return text.splitlines()[0] if text else repr(error)
