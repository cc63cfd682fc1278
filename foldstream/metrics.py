"""Prometheus metrics of an instance, served at ``GET /metrics``.

Each instance has a registry of its own, not prometheus-client's global one: nothing else an
application imports can add to or clash with what an instance serves. What it holds:

- ``foldstream_projection_batch_seconds{store}``: each micro-batch of a projection, start to
  end of its trigger (Spark's ``triggerExecution``), the time that bounds freshness;
- ``foldstream_projection_phase_seconds{store,phase}``: the parts Spark reports of each trigger
  (``latestOffset``, ``queryPlanning``, ``addBatch``, ``walCommit``, ``commitOffsets`` ...);
- ``foldstream_projection_task_seconds{store,step}``: the steps of each of its tasks that
  completed (``input``: fetching the records from Kafka, ``decode``, ``read``, ``fold``,
  ``changelog``: waiting for the changelog's acknowledgements, ``commit``), as the tasks report
  them through the store host;
- ``foldstream_projection_records_total{store}``: records the projection's completed tasks
  handled, as they report them (Spark's ``numInputRows`` counts the partitions they advanced);
- ``foldstream_projection_poison_records_total{store,outcome}``: records the projection could
  not fold, by what became of them (``dead_lettered``, ``skipped``, ``stopped``: its store's
  ``on_error``), as its completed tasks report them;
- ``foldstream_projection_late_records_total{store}``: records a windowed store dropped because
  every window they fall into had closed (:mod:`~foldstream.projections.windows`), as its
  completed tasks report them;
- ``foldstream_command_transactions_total`` / ``foldstream_commands_committed_total``: Kafka
  transactions of the command side and the commands they carried (group commit: their ratio
  is the commands per transaction);
- ``foldstream_command_replay_skipped_total``: records the command side skipped while it
  replayed its partitions (not foldstream events, or events it could not decode or apply);
- ``foldstream_command_replayed_events_total`` / ``foldstream_command_snapshots_written_total``:
  events the command side's takeovers replayed (only those past the aggregate store's
  snapshots) and aggregate snapshots it wrote to the aggregate store;
- ``foldstream_partition_role{topic,partition,role}`` and
  ``foldstream_partition_lag{store,partition}``: what this instance serves (``active``),
  restores or keeps a ``standby`` copy of, and how far behind each local copy is;
- ``foldstream_cluster_invalid_records_total``: records of the cluster topic ignored as invalid;
- ``foldstream_cluster_suspicions_total`` / ``foldstream_cluster_suspects``: members that turned
  suspect (heartbeats late: nothing is routed to them) in this instance's view, and those that
  are now; ``foldstream_cluster_view_current``: 1 while this instance's own heartbeats are read
  back within the session timeout (0: it answers as if cut off from the cluster).

The micro-batch figures come from Spark's progress reports through a
:class:`~pyspark.sql.streaming.StreamingQueryListener`, so every micro-batch is counted once,
however fast they follow each other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from foldstream.cluster.node import ClusterFigures

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Micro-batch durations from a do-nothing batch (≈0.1 s) to a rebuild's large ones.
BATCH_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
#: Parts of a batch: checkpoint writes and planning take milliseconds, ``addBatch`` the rest.
PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _CommandCounts(Collector):
    """Reads the command side's counters when scraped: nothing to do per command."""

    def __init__(self, counts: Callable[[], Mapping[str, int] | None]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts() or {}
        for name, documentation, key in _COMMAND_COUNTERS:
            yield CounterMetricFamily(name, documentation, value=counts.get(key, 0))


#: The command side's counters: ``(metric, help, key of the handler's counts)``.
_COMMAND_COUNTERS = (
    (
        "foldstream_command_transactions",
        "Kafka transactions committed by the command side",
        "transactions",
    ),
    ("foldstream_commands_committed", "Commands whose events were committed", "commands"),
    (
        "foldstream_command_replay_skipped",
        "Records the command side skipped replaying its partitions: not foldstream events, "
        "or events it could not decode or apply",
        "replay_skipped",
    ),
    (
        "foldstream_command_replayed_events",
        "Events the command side's takeovers replayed (past the aggregate store's snapshots)",
        "replayed_events",
    ),
    (
        "foldstream_command_snapshots_written",
        "Aggregate snapshots the command side wrote to the aggregate store",
        "snapshots_written",
    ),
)


class _ClusterFigures(Collector):
    """Reads the cluster member's figures when scraped."""

    def __init__(self, figures: Callable[[], ClusterFigures | None]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        figures = self._figures()
        invalid = CounterMetricFamily(
            "foldstream_cluster_invalid_records",
            "Records of the cluster topic ignored because they were invalid",
            value=0 if figures is None else figures["invalid_records"],
        )
        roles = GaugeMetricFamily(
            "foldstream_partition_role",
            "1 for each partition this instance serves (active), restores or keeps a standby "
            "copy of",
            labels=["topic", "partition", "role"],
        )
        lag = GaugeMetricFamily(
            "foldstream_partition_lag",
            "Records a local copy lacks: source records for an active copy, changelog records "
            "for a standby",
            labels=["store", "partition"],
        )
        if figures is not None:
            for (topic, partition), role in sorted(figures["roles"].items()):
                roles.add_metric([topic, str(partition), role], 1)
            for copy, behind in sorted(figures["lag"].items()):
                store, _, number = copy.rpartition("/")
                lag.add_metric([store, number], behind)
        yield from (invalid, roles, lag, *_standing(figures))


def _standing(figures: ClusterFigures | None) -> tuple[Metric, ...]:
    """How this member sees the others (suspects) and itself (whether its view is current)."""
    suspicions, suspects, current = (
        (0, 0, False)
        if figures is None
        else (figures["suspicions"], figures["suspects"], figures["view_current"])
    )
    return (
        CounterMetricFamily(
            "foldstream_cluster_suspicions",
            "Members that turned suspect (heartbeats late: no request is sent to them)",
            value=suspicions,
        ),
        GaugeMetricFamily(
            "foldstream_cluster_suspects",
            "Members that are suspects now",
            value=suspects,
        ),
        GaugeMetricFamily(
            "foldstream_cluster_view_current",
            "1 while this instance's own heartbeats are read back within the session timeout",
            value=int(current),
        ),
    )


class InstanceMetrics:
    """The metrics of one instance. ``command_counts()`` returns the command side's
    ``{"transactions": n, "commands": n, "replay_skipped": n}`` and ``cluster()`` the cluster
    member's figures (None while they are not running)."""

    def __init__(
        self,
        *,
        command_counts: Callable[[], Mapping[str, int] | None],
        cluster: Callable[[], ClusterFigures | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.batch_seconds = Histogram(
            "foldstream_projection_batch_seconds",
            "Duration of a projection's micro-batch (Spark's triggerExecution)",
            ["store"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.phase_seconds = Histogram(
            "foldstream_projection_phase_seconds",
            "Duration of a part of a projection's micro-batch, as Spark reports it",
            ["store", "phase"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self.task_seconds = Histogram(
            "foldstream_projection_task_seconds",
            "Time a projection's completed task spent in a step: fetching its records, "
            "decoding them, reading values, folding, waiting for changelog acks, committing",
            ["store", "step"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self.records = Counter(
            "foldstream_projection_records",
            "Records handled by a projection's completed tasks",
            ["store"],
            registry=self.registry,
        )
        self.poison_records = Counter(
            "foldstream_projection_poison_records",
            "Records a projection could not fold, by what became of them (its store's "
            "on_error): dead_lettered, skipped, or stopped (the partition stopped at it)",
            ["store", "outcome"],
            registry=self.registry,
        )
        self.late_records = Counter(
            "foldstream_projection_late_records",
            "Records a windowed store dropped because every window they fall into had closed "
            "(end + grace at or before the partition's stream time)",
            ["store"],
            registry=self.registry,
        )
        self.registry.register(_CommandCounts(command_counts))
        self.registry.register(_ClusterFigures(cluster))

    def observe_progress(self, store: str, progress: Mapping[str, Any]) -> None:
        """Record one of Spark's progress reports (``StreamingQueryProgress`` as a dict)."""
        durations = progress.get("durationMs") or {}
        total = durations.get("triggerExecution")
        if total is None:
            return
        self.batch_seconds.labels(store).observe(total / 1e3)
        for phase, ms in durations.items():
            if phase != "triggerExecution":
                self.phase_seconds.labels(store, phase).observe(ms / 1e3)

    def observe_task(self, store: str, seconds: Mapping[str, float], records: int) -> None:
        """Record one projection task's ``{step: seconds}`` and the records it handled."""
        for step, spent in seconds.items():
            self.task_seconds.labels(store, step).observe(spent)
        self.records.labels(store).inc(records)

    def observe_poison(self, store: str, outcomes: Mapping[str, int]) -> None:
        """Record a projection task's poison records, ``{outcome: records}``."""
        for outcome, records in outcomes.items():
            self.poison_records.labels(store, outcome).inc(records)

    def observe_late(self, store: str, records: int) -> None:
        """Record ``records`` a windowed store's task dropped as late."""
        self.late_records.labels(store).inc(records)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)  # type: ignore[no-any-return]


class _ProgressListener:
    """A Java ``PythonStreamingQueryListener`` that hands each progress report to
    :meth:`InstanceMetrics.observe_progress` as Spark's own JSON of it.

    pyspark's :class:`~pyspark.sql.streaming.StreamingQueryListener` converts every report into
    Python objects field by field, a py4j round trip each (sources, sink, durations, event
    times...); one ``json()`` call is all the metrics need.
    """

    def __init__(self, metrics: InstanceMetrics, stores: Mapping[str, tuple[str, ...]]) -> None:
        self.metrics = metrics
        self.stores = stores  # not copied: it may gain stores (rebuilds)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            progress = json.loads(event.progress().json())
            # A query shared by several stores counts its micro-batches for each of them.
            for store in self.stores.get(progress.get("name"), ()):
                self.metrics.observe_progress(store, progress)
        except Exception:  # noqa: BLE001 - a metric must never stop the query's events
            log.exception("recording a projection's progress")

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def listen_to_progress(
    spark: SparkSession, metrics: InstanceMetrics, stores: Mapping[str, tuple[str, ...]]
) -> Callable[[], None]:
    """Feed ``metrics`` with the progress of the queries named in ``stores`` (``{query name:
    its stores}``); return what removes the listener."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    wrapper = spark._jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper  # type: ignore[union-attr]
    listener = wrapper(_ProgressListener(metrics, stores))
    manager = spark._jsparkSession.streams()
    manager.addListener(listener)
    return lambda: manager.removeListener(listener)
