"""The two designs :mod:`bench.sources` compares, each a query folding the inventory's ``stock``
into a store host of its own: foldstream's Python Data Source (through
:class:`~foldstream.projections.runner.ProjectionRunner`, as an instance runs it) and Spark's
Kafka source (:mod:`bench.spark_kafka`), with a task per Kafka partition or coalesced."""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.inventory import PARTITIONS
from bench.rebuild import SERVICE_PATH, STORE
from bench.run import BenchRun
from bench.spark_kafka import kafka_source_query
from foldstream.examples.inventory import service
from foldstream.kafka import TopicSpec, ensure_topics
from foldstream.kafka_client import spark_options
from foldstream.projections.graph import forwards_option
from foldstream.projections.query_groups import stores_option
from foldstream.projections.runner import ProjectionRunner
from foldstream.settings import Settings
from foldstream.state.host import StoreHost

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


@dataclass(frozen=True)
class Design:
    """A way to read the events: foldstream's source, or Spark's Kafka source with a task per
    Kafka partition (``tasks`` None) or coalesced into ``tasks``."""

    name: str
    kafka: bool
    tasks: int | None = None


PYTHON = Design("foldstream Python source", kafka=False)
KAFKA = Design("Spark Kafka source", kafka=True)
KAFKA_ONE_TASK = Design("Spark Kafka source, 1 task", kafka=True, tasks=1)
REBUILD_DESIGNS = (PYTHON, KAFKA)
FRESHNESS_DESIGNS = (PYTHON, KAFKA, KAFKA_ONE_TASK)


class Visibility:
    """When each partition's store was written up to which offset (the store host's
    ``on_applied``)."""

    def __init__(self) -> None:
        self.writes: dict[int, list[tuple[int, float]]] = {p: [] for p in range(PARTITIONS)}

    def note(self, store: str, partition: int, offset: int) -> None:
        self.writes[partition].append((offset, time.monotonic()))

    def visible_at(self, partition: int, offset: int) -> float | None:
        """When ``offset`` of ``partition`` was first in the store."""
        writes = self.writes[partition]
        index = bisect.bisect_left(writes, offset, key=lambda write: write[0])
        return writes[index][1] if index < len(writes) else None

    def wait_for(self, last: Mapping[int, int], timeout: float) -> float:
        """When every partition's store held its ``last`` offset (waiting up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = [self.visible_at(p, offset) for p, offset in last.items()]
            if all(at is not None for at in seen):
                return max(at for at in seen if at is not None)
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every partition reached {dict(last)} in {timeout:.0f}s")
            time.sleep(0.005)


@dataclass
class RunningProjection:
    """``stock`` of ``settings``' events topic folded by ``design``'s query into a store host
    of its own (empty stores), noting each write in ``seen``."""

    spark: SparkSession
    design: Design
    settings: Settings
    seen: Visibility = field(default_factory=Visibility)

    def __post_init__(self) -> None:
        self.host = StoreHost(
            state_dir=self.settings.state_dir,
            on_applied=self.seen.note,
            formats={STORE: service.projection(STORE).table_format},
        )
        self._stop: list[Any] = []
        self.query: StreamingQuery | None = None

    def start(self) -> None:
        topic = self.settings.events_topic
        self.host.start()
        self._stop.append(self.host.stop)
        for partition in range(PARTITIONS):
            self.host.open(STORE, partition, identity=f"{topic}/{partition}", epoch=1)
        if self.design.kafka:
            query = kafka_source_query(
                self.spark,
                fold_options=self._fold_options(),
                starts=dict.fromkeys(range(PARTITIONS), 0),
                max_records_per_partition=self.settings.batch_records_per_partition,
                checkpoint=self.settings.state_dir / "spark",
                name=f"{self.settings.service}.kafka",
                tasks=self.design.tasks,
            )
            self._stop.append(query.stop)
            self.query = query
            return
        runner = ProjectionRunner(
            spark=self.spark,
            settings=self.settings,
            host=self.host,
            service_path=SERVICE_PATH,
            projections=[service.projection(STORE)],
            partitions={topic: PARTITIONS},
        )
        runner.start()
        self._stop.append(runner.stop)
        runner.run({topic: range(PARTITIONS)})
        self.query = runner.queries[STORE]

    def _fold_options(self) -> dict[str, str]:
        """What foldstream's own source gives its tasks (the runner's options), less the
        planning ones."""
        settings, topic = self.settings, self.settings.events_topic
        projections = [service.projection(STORE)]
        entry = {
            "store": STORE,
            "changelog_topic": settings.changelog_topic(STORE),
            "dead_letter_topic": settings.dead_letter_topic(STORE),
            "forwards": forwards_option(projections, STORE, topic, {topic: PARTITIONS}),
        }
        return {
            "bootstrap": settings.bootstrap_servers,
            "topic": topic,
            "service": SERVICE_PATH,
            "store_host": self.host.address,
            "store_token": self.host.authkey.hex(),
            "stores": stores_option([entry]),
            **spark_options(),
        }

    def batch_ms(self) -> float:
        """The median duration of the recent micro-batches that had records (ms)."""
        recent = [] if self.query is None else self.query.recentProgress
        times = [p["durationMs"]["triggerExecution"] for p in recent if p["numInputRows"]]
        return statistics.median(times) if times else float("nan")

    def stop(self) -> None:
        while self._stop:
            self._stop.pop()()


def projection_settings(run: BenchRun, service_name: str, bootstrap: str) -> Settings:
    """The settings of a service of its own, its events and changelog topics created."""
    settings = Settings(
        service=service_name,
        bootstrap_servers=bootstrap,
        state_dir=run.tmp / service_name,
        partitions=PARTITIONS,
    )
    ensure_topics(
        bootstrap,
        [
            TopicSpec(settings.events_topic, PARTITIONS),
            TopicSpec(settings.changelog_topic(STORE), PARTITIONS, compact=True),
        ],
    )
    return settings
