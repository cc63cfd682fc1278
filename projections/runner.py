"""Runs a service's projections as Spark Structured Streaming queries.

Source offsets live with the state in RocksDB, so Spark's checkpoint is scratch space: every
start resumes from what the stores hold, which is exact even if a checkpoint is lost or stale.
A query that fails (a task failing past Spark's attempts: the broker, the store host, the
changelog; a record that cannot be folded never fails it, see
:mod:`~foldstream.projections.poison`) is restarted from those offsets, forever, after waits that
grow from :data:`RESTART_WAIT_MIN_S` to :data:`RESTART_WAIT_MAX_S`; readiness names the failure
until a restarted query completes a micro-batch. A partition stopped at a poison record (store
policy ``stop``) is left out of its query until the instance restarts, and readiness names it.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tenacity import RetryCallState, Retrying, wait_exponential

from foldstream.kafka_client import spark_options
from foldstream.projections.graph import forwards_option
from foldstream.projections.projection import Projection
from foldstream.projections.source import write_owned
from foldstream.state.host import StoreHost

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from foldstream.settings import Settings

log = logging.getLogger(__name__)

#: The wait before restarting a failed query: doubling with each failure in a row, from the
#: first to the longest (short enough that a query failed by a broker outage folds again a few
#: seconds after the broker is back).
RESTART_WAIT_MIN_S = 1.0
RESTART_WAIT_MAX_S = 5.0
SUPERVISE_INTERVAL_S = 0.5

_restart_wait = wait_exponential(multiplier=RESTART_WAIT_MIN_S, max=RESTART_WAIT_MAX_S)


def restart_delay(failures: int) -> float:
    """Seconds to wait before restarting a query after its ``failures``-th failure in a row
    (tenacity's ``wait_exponential``)."""
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = failures
    return float(_restart_wait(state))


@dataclass
class _Failing:
    """A projection whose query failed: how often in a row, the last error, when its next
    restart is due, and the query that failed last (a restart replaces it)."""

    failures: int
    error: str
    restart_at: float
    query: StreamingQuery


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
        self._failing: dict[str, _Failing] = {}
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
            self._launch(projection)
        self._supervisor.start()

    def add(self, projection: Projection) -> None:
        """Start the query of ``projection`` (a store added while the instance runs: a rebuild
        generation), reading no partition until :meth:`run` gives it the ones held."""
        with self._lock:
            if self._stopping.is_set() or projection.store in self.queries:
                return
            self._launch(projection)
            self.projections = [*self.projections, projection]
        log.info("projection %s started", projection.store)

    def _launch(self, projection: Projection) -> None:
        """Start ``projection``'s query with no partition owned yet."""
        write_owned(self._owned_path(projection.store), {})
        self._owned[projection.store] = {}
        self.queries[projection.store] = self._start(projection)

    def _await_first_trigger(self, query: StreamingQuery) -> None:
        """Wait (up to :attr:`start_timeout_s`) until ``query`` has run its first trigger, before
        starting the next query.

        Spark plans a query's Python source in Python workers that it keeps for reuse, one per
        planning step in progress: queries started together each get their own (idle once the
        queries run), queries started one after another share them, at the same ready time
        (docs/decisions.md, "The Spark session").
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
                wanted = set(owned.get(topic, ())) - self._stopped_partitions(store)
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
            .option("max_records_per_partition", str(settings.batch_records_per_partition))
            # Large micro-batches (rebuilds) are split into one task per core.
            .option("tasks", str(self.spark.sparkContext.defaultParallelism))
            .option("service", self.service_path)
            .option("store", projection.store)
            .option("store_host", self.host.address)
            .option("store_token", self.host.authkey.hex())
            .option("changelog_topic", settings.changelog_topic(projection.store))
            .option("dead_letter_topic", settings.dead_letter_topic(projection.store))
            # Where its tasks forward its changes (stores others read: docs/rekeying-and-joins.md)
            .option("forwards", self._forwards(projection))
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

    def _forwards(self, projection: Projection) -> str:
        return forwards_option(
            self.projections, projection.store, self.settings.events_topic, self.partitions
        )

    def _supervise_loop(self) -> None:
        while not self._stopping.wait(SUPERVISE_INTERVAL_S):
            try:
                self.restart_failed()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("supervising the projections")

    def restart_failed(self) -> None:
        """Restart each query that stopped with an error (a Spark task failing past its
        attempts), from the offsets its stores hold, once its wait is over; and leave the
        partitions stopped at a poison record out of their queries."""
        with self._lock:
            self._leave_stopped_out()
            for projection in self.projections:
                if self._stopping.is_set():
                    return
                self._supervise(projection, time.monotonic())

    def _supervise(self, projection: Projection, now: float) -> None:
        store = projection.store
        query = self.queries[store]
        failing = self._failing.get(store)
        error = query.exception()
        if error is None:
            if failing is not None and failing.query is not query and query.lastProgress:
                log.info("projection %s recovered after %d failures", store, failing.failures)
                del self._failing[store]
            return
        if failing is None or failing.query is not query:
            failures = 1 if failing is None else failing.failures + 1
            failing = _Failing(
                failures, _error_summary(error), now + restart_delay(failures), query
            )
            self._failing[store] = failing
            log.warning(
                "projection %s failed (%s), %d times in a row; restarting it in %.0fs",
                store,
                failing.error,
                failures,
                failing.restart_at - now,
            )
        if now < failing.restart_at:
            return
        try:
            self._restart(projection)
        except Exception as exc:  # noqa: BLE001 - tried again after the next wait
            log.exception("restarting projection %s", store)
            failing.failures += 1
            failing.error = f"restarting it failed: {_error_summary(exc)}"
            failing.restart_at = now + restart_delay(failing.failures)

    def _restart(self, projection: Projection) -> None:
        store = projection.store
        topic = projection.source_topic(self.settings.events_topic)
        # A task of the failed query still writing can only move an offset forward: the new
        # query's tasks skip what the stores hold by then.
        starts = stored_offsets(self.host, store, topic, sorted(self._owned[store]))
        log.warning("projection %s restarts from %s", store, starts)
        write_owned(self._owned_path(store), starts)
        self._owned[store] = starts
        self.queries[store] = self._start(projection)

    def _stopped_partitions(self, store: str) -> set[int]:
        return {p for s, p in self.host.stopped() if s == store}

    def _leave_stopped_out(self) -> None:
        """Take the partitions a task stopped out of their queries (the store host already
        refuses their tasks): no micro-batch plans them any more."""
        for projection in self.projections:
            store = projection.store
            stopped = self._stopped_partitions(store) & set(self._owned[store])
            if stopped:
                log.warning("projection %s leaves stopped partitions %s", store, sorted(stopped))
                kept = {p: o for p, o in self._owned[store].items() if p not in stopped}
                write_owned(self._owned_path(store), kept)
                self._owned[store] = kept

    def stopped(self) -> dict[tuple[str, int], str]:
        """``{(store, partition): reason}`` of the partitions whose folding stopped at a
        record their store could not fold (policy ``stop``): the offset and the error. They
        stay stopped until the instance restarts or the partition moves away and back."""
        return {
            key: f"stopped at offset {stop.offset}: {stop.error}"
            for key, stop in sorted(self.host.stopped().items())
        }

    def failure(self, counts: Callable[[str], bool] = lambda store: True) -> str | None:
        """Why the projections of the stores that ``counts`` are not current, for readiness,
        or None: each query that failed (until a restarted one completes a micro-batch) and
        each stopped partition. (A store version being built does not count: the one
        answering does, :mod:`foldstream.cluster.versions`.)"""
        now = time.monotonic()
        problems = []
        for store, failing in sorted(self._failing.items()):
            if not counts(store):
                continue
            waiting = failing.query is self.queries.get(store) and failing.restart_at > now
            then = f"restarting it in {failing.restart_at - now:.0f}s" if waiting else "restarted"
            times = "once" if failing.failures == 1 else f"{failing.failures} times in a row"
            problems.append(
                f"projection {store!r} failed {times}, last with: {failing.error}; {then}"
            )
        problems += [
            f"store {store!r} partition {partition} {reason} (on_error='stop': fix the cause, "
            "then restart the instance)"
            for (store, partition), reason in self.stopped().items()
            if counts(store)
        ]
        return "; ".join(problems) or None

    def retire(self, store: str) -> None:
        """Stop the query of ``store`` (a store version retired,
        :mod:`foldstream.cluster.versions`) for good: it is neither run nor restarted again."""
        with self._lock:
            self.projections = [p for p in self.projections if p.store != store]
            query = self.queries.pop(store, None)
            self._owned.pop(store, None)
            self._failing.pop(store, None)
        if query is not None:
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - stopped with an error: stopped all the same
                log.exception("stopping the query of retired store %s", store)
        self._owned_path(store).unlink(missing_ok=True)
        shutil.rmtree(self.settings.state_dir / "spark" / store, ignore_errors=True)

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


#: The line a Python traceback ends with: the exception raised, whatever its class's name.
_RAISED = re.compile(r"Traceback \(most recent call last\):\n(?:[ \t].*\n)+(\S.*)$", re.MULTILINE)
_PYTHON_ERROR = re.compile(r"^\w[\w.]*(?:Error|Exception): .*$", re.MULTILINE)


def _error_summary(error: object) -> str:
    """The Python error inside a Spark error (else its first line), without stack traces."""
    text = str(error).strip()
    raised = _RAISED.search(text) or _PYTHON_ERROR.search(text)
    if raised is not None:
        return raised.group(raised.lastindex or 0)
    return text.splitlines()[0] if text else repr(error)
