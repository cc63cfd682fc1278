"""Runs a service's projections as Spark Structured Streaming queries, the stores of a topic
that fold on their own sharing one (:mod:`~foldstream.projections.query_groups`).

Source offsets live with the state in RocksDB, so Spark's checkpoint is scratch space: every
start resumes from what the stores hold, which is exact even if a checkpoint is lost or stale.
A query that fails (a task failing past Spark's attempts: the broker, the store host, the
changelog; a record that cannot be folded never fails it, see
:mod:`~foldstream.projections.poison`) is restarted from those offsets, forever, after waits that
grow (:mod:`~foldstream.projections.query_failures`); readiness names the failure until a
restarted query completes a micro-batch. A partition stopped at a poison record (store policy
``stop``) is left out of its query until the instance restarts, and readiness names it (in a
query of several stores, the others fold it on).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from foldstream.kafka_client import spark_options
from foldstream.projections.graph import forwards_option
from foldstream.projections.projection import Projection
from foldstream.projections.query_failures import Failing, error_summary, restart_delay
from foldstream.projections.query_groups import (
    QueryGroup,
    query_groups,
    start_offsets,
    stores_option,
)
from foldstream.projections.source import write_owned
from foldstream.state.host import StoreHost

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from foldstream.settings import Settings

log = logging.getLogger(__name__)

SUPERVISE_INTERVAL_S = 0.5


def query_name(service: str, store: str) -> str:
    """The name of the streaming query of ``service``'s projection into ``store`` (or into the
    stores of a :class:`~foldstream.projections.query_groups.QueryGroup`, its key)."""
    return f"{service}.{store}"


class ProjectionRunner:
    """Runs the projections' streaming queries over the source partitions this instance owns:
    the stores of a topic that fold on their own share one
    (:mod:`~foldstream.projections.query_groups`).

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
        # By query group key (a store's name, for a query of one store).
        self.groups: dict[str, QueryGroup] = {}
        self.queries: dict[str, StreamingQuery] = {}
        self._owned: dict[str, dict[int, int]] = {}
        self._failing: dict[str, Failing] = {}
        self._retired: set[str] = set()  # left in a shared query (:meth:`retire`)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(
            target=self._supervise_loop, name="projection-supervisor", daemon=True
        )

    def _owned_path(self, key: str) -> Path:
        scratch = self._scratch(key)
        return scratch.with_name(f"{scratch.name}.owned.json")

    def _scratch(self, key: str) -> Path:
        """A query's scratch directory (its checkpoint), named by its key; a shared query's
        long key by its digest (a file name is at most 255 bytes)."""
        if len(key.encode()) > 100:
            key = "shared-" + hashlib.sha256(key.encode()).hexdigest()[:24]
        return self.settings.state_dir / "spark" / key

    def start(self) -> None:
        """Start every query, reading no partition until :meth:`run` says so."""
        previous = None
        for group in query_groups(self.projections, self.settings.events_topic):
            if previous is not None:
                self._await_first_trigger(self.queries[previous])
            self._launch(group)
            previous = group.key
        self._supervisor.start()

    def add(self, projection: Projection) -> None:
        """Start the query of ``projection`` (a store added while the instance runs: a rebuild
        generation), reading no partition until :meth:`run` gives it the ones held."""
        with self._lock:
            if self._stopping.is_set() or self._group_of(projection.store) is not None:
                return
            topic = projection.source_topic(self.settings.events_topic)
            self._launch(QueryGroup(topic, (projection,)))
            self.projections = [*self.projections, projection]
        log.info("projection %s started", projection.store)

    def _launch(self, group: QueryGroup) -> None:
        """Start ``group``'s query with no partition owned yet; it is known once started."""
        write_owned(self._owned_path(group.key), {})
        self.queries[group.key] = self._start(group)
        self._owned[group.key] = {}
        self.groups[group.key] = group

    def _group_of(self, store: str) -> QueryGroup | None:
        return next((g for g in self.groups.values() if store in g.stores), None)

    def _starts(self, group: QueryGroup, partitions: Iterable[int]) -> dict[int, int]:
        stopped = {store: self._stopped_partitions(store) for store in self._live(group)}
        return start_offsets(self.host, group.topic, stopped, partitions)

    def _stopped_everywhere(self, group: QueryGroup) -> set[int]:
        """The partitions every store of ``group`` stopped (policy ``stop``): nothing reads
        them. A partition only some stopped is read for the others; the store host refuses
        the stopped ones' tasks."""
        stopped = [self._stopped_partitions(store) for store in self._live(group)]
        return set.intersection(*stopped) if stopped else set()

    def _live(self, group: QueryGroup) -> list[str]:
        """The stores of ``group`` not retired (:meth:`retire`)."""
        return [store for store in group.stores if store not in self._retired]

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
            for key, group in self.groups.items():
                wanted = set(owned.get(group.topic, ())) - self._stopped_everywhere(group)
                current = self._owned[key]
                if wanted == set(current):
                    continue
                starts = self._starts(group, wanted - set(current))
                log.info("projection %s processes %s (new: %s)", key, sorted(wanted), starts)
                updated = {p: o for p, o in current.items() if p in wanted} | starts
                write_owned(self._owned_path(key), updated)
                self._owned[key] = updated
                if set(current) - wanted:
                    self._quiesce(key)

    def _quiesce(self, key: str) -> None:
        # A micro-batch planned before the file changed may still write the dropped partitions:
        # wait until the trigger running now (if any) has finished.
        query = self.queries[key]
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

    def _start(self, group: QueryGroup) -> StreamingQuery:
        settings = self.settings
        # Spark resolves the Python data sources through the calling thread's active session,
        # which a thread other than the one that built the session (the supervisor) lacks.
        jvm_session = type(self.spark)._get_j_spark_session_class(self.spark._jvm)
        jvm_session.setActiveSession(self.spark._jsparkSession)
        scratch = self._scratch(group.key)
        shutil.rmtree(scratch, ignore_errors=True)
        folded = (
            self.spark.readStream.format("foldstream-fold")
            .option("bootstrap", settings.bootstrap_servers)
            .option("topic", group.topic)
            .option("partitions", ",".join(map(str, range(self.partitions[group.topic]))))
            .option("owned", str(self._owned_path(group.key).resolve()))
            .option("fetch_wait_max_ms", str(settings.fetch_wait_max_ms))
            .option("max_records_per_partition", str(settings.batch_records_per_partition))
            # Large micro-batches (rebuilds) are split into one task per core.
            .option("tasks", str(self.spark.sparkContext.defaultParallelism))
            .option("service", self.service_path)
            .option("store_host", self.host.address)
            .option("store_token", self.host.authkey.hex())
            # Each store's topics, and where its tasks forward its changes (stores others read:
            # docs/rekeying-and-joins.md)
            .option("stores", stores_option([self._store_entry(p) for p in group.projections]))
            # The tasks' Kafka clients get the instance's client properties (security).
            .options(**spark_options())
            .load()
        )
        # The tasks fold as they read: what they yield (a row per partition) is dropped by
        # the JVM, with no Python sink and its second Python worker per task.
        return (
            folded.writeStream.format("noop")
            .queryName(query_name(settings.service, group.key))
            .option("checkpointLocation", str(scratch / uuid.uuid4().hex))
            .start()
        )

    def _store_entry(self, projection: Projection) -> dict[str, str]:
        store, settings = projection.store, self.settings
        forwards = forwards_option(self.projections, store, settings.events_topic, self.partitions)
        return {
            "store": store,
            "changelog_topic": settings.changelog_topic(store),
            "dead_letter_topic": settings.dead_letter_topic(store),
            "forwards": forwards,
        }

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
            for key in list(self.groups):
                if self._stopping.is_set():
                    return
                self._supervise(key, time.monotonic())

    def _supervise(self, key: str, now: float) -> None:
        query = self.queries[key]
        failing = self._failing.get(key)
        error = query.exception()
        if error is None:
            if failing is not None and failing.query is not query and query.lastProgress:
                log.info("projection %s recovered after %d failures", key, failing.failures)
                del self._failing[key]
            return
        if failing is None or failing.query is not query:
            failures = 1 if failing is None else failing.failures + 1
            failing = Failing(failures, error_summary(error), now + restart_delay(failures), query)
            self._failing[key] = failing
            log.warning(
                "projection %s failed (%s), %d times in a row; restarting it in %.0fs",
                key,
                failing.error,
                failures,
                failing.restart_at - now,
            )
        if now < failing.restart_at:
            return
        try:
            self._restart(key)
        except Exception as exc:  # noqa: BLE001 - tried again after the next wait
            log.exception("restarting projection %s", key)
            failing.failures += 1
            failing.error = f"restarting it failed: {error_summary(exc)}"
            failing.restart_at = now + restart_delay(failing.failures)

    def _restart(self, key: str) -> None:
        group = self.groups[key]
        # A task of the failed query still writing can only move an offset forward: the new
        # query's tasks skip what the stores hold by then.
        starts = self._starts(group, self._owned[key])
        log.warning("projection %s restarts from %s", key, starts)
        write_owned(self._owned_path(key), starts)
        self._owned[key] = starts
        self.queries[key] = self._start(group)

    def _stopped_partitions(self, store: str) -> set[int]:
        return {p for s, p in self.host.stopped() if s == store}

    def _leave_stopped_out(self) -> None:
        """Take the partitions a task stopped out of their queries (the store host already
        refuses their tasks): no micro-batch plans them any more."""
        for key, group in self.groups.items():
            stopped = self._stopped_everywhere(group) & set(self._owned[key])
            if stopped:
                log.warning("projection %s leaves stopped partitions %s", key, sorted(stopped))
                kept = {p: o for p, o in self._owned[key].items() if p not in stopped}
                write_owned(self._owned_path(key), kept)
                self._owned[key] = kept

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
        for key, failing in sorted(self._failing.items()):
            group = self.groups.get(key)  # retired meanwhile: nothing to say
            if group is None:
                continue
            waiting = failing.query is self.queries.get(key) and failing.restart_at > now
            then = f"restarting it in {failing.restart_at - now:.0f}s" if waiting else "restarted"
            times = "once" if failing.failures == 1 else f"{failing.failures} times in a row"
            problems += [
                f"projection {store!r} failed {times}, last with: {failing.error}; {then}"
                for store in self._live(group)
                if counts(store)
            ]
        problems += [
            f"store {store!r} partition {partition} {reason} (on_error='stop': fix the cause, "
            "then restart the instance)"
            for (store, partition), reason in self.stopped().items()
            if counts(store)
        ]
        return "; ".join(problems) or None

    def retire(self, store: str) -> None:
        """Stop folding ``store`` (a store version retired, :mod:`foldstream.cluster.versions`)
        for good. A query of its own stops and is never restarted. In a query shared with other
        stores (a store rebuilt on demand while it shared one) its tasks are refused by the
        store host from now on and skip it: stopping that query would pause the others, and at
        the next start it is gone."""
        with self._lock:
            self.projections = [p for p in self.projections if p.store != store]
            group = self._group_of(store)
            if group is None:
                return
            self._retired.add(store)
            if self._live(group):
                self.host.refuse(store)
                return
            key = group.key
            del self.groups[key]
            query = self.queries.pop(key)
            self._owned.pop(key, None)
            self._failing.pop(key, None)
        _stop_query(query, key)
        self._owned_path(key).unlink(missing_ok=True)
        shutil.rmtree(self._scratch(key), ignore_errors=True)

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor.is_alive():
            self._supervisor.join()
        for key, query in self.queries.items():
            _stop_query(query, key)
        self.queries.clear()


def _stop_query(query: StreamingQuery, key: str) -> None:
    try:
        query.stop()
    except Exception:  # noqa: BLE001 - stopped with an error: stopped all the same
        log.exception("stopping the query of %s", key)
