"""One running instance of a service: command handler, Spark projections and query API.

Resources are opened in the Starlette lifespan and closed in reverse order; the HTTP server
stops answering before the stores are closed, so a stopping instance never serves a lookup from
a closed store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from confluent_kafka.admin import AdminClient
from starlette.applications import Starlette

from foldstream.commands import CommandHandler
from foldstream.commands.http import command_routes
from foldstream.errors import ConfigurationError, FoldstreamError, PartitionFenced
from foldstream.kafka import TopicSpec, ensure_topics, topic_partitions
from foldstream.offsets import EndOffsets, holds_records
from foldstream.projections.runner import ProjectionRunner
from foldstream.query_api import StoreReaders, query_routes
from foldstream.service import Service
from foldstream.settings import Settings

log = logging.getLogger(__name__)


class Instance:
    """Builds the ASGI app of ``service`` (found at import path ``service_path``)."""

    def __init__(self, *, service: Service, service_path: str, settings: Settings) -> None:
        self.service = service
        self.service_path = service_path
        self.settings = settings
        self.handler: CommandHandler | None = None
        self.readers: StoreReaders | None = None
        self.runner: ProjectionRunner | None = None
        self._ends: dict[str, EndOffsets] = {}
        self._retaking: set[asyncio.Task[None]] = set()
        self._empty_spans: dict[tuple[str, int], tuple[int, int]] = {}
        self.app = Starlette(
            routes=[
                *command_routes(lambda: self._require(self.handler)),
                *query_routes(lambda: self._require(self.readers), self.readiness),
            ],
            lifespan=self._lifespan,
        )

    @staticmethod
    def _require(resource: Any) -> Any:
        if resource is None:
            raise RuntimeError("the instance is not started")
        return resource

    def provision(self) -> dict[str, int]:
        """Create the service's topics; return ``{topic: partitions}`` of every source topic."""
        settings = self.settings
        specs = [TopicSpec(settings.events_topic, settings.partitions)]
        specs += [
            TopicSpec(settings.changelog_topic(p.store), settings.partitions, compact=True)
            for p in self.service.projections
            if p.source_topic(settings.events_topic) == settings.events_topic
        ]
        admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
        layout = {settings.events_topic: settings.partitions}
        for projection in self.service.projections:
            topic = projection.source_topic(settings.events_topic)
            if topic in layout:
                continue
            count = topic_partitions(admin, topic)
            if count is None:
                raise ConfigurationError(
                    f"store {projection.store!r} reads topic {topic!r}, which does not exist"
                )
            layout[topic] = count
            specs.append(TopicSpec(settings.changelog_topic(projection.store), count, compact=True))
        ensure_topics(
            settings.bootstrap_servers, specs, replication_factor=settings.replication_factor
        )
        return layout

    # --- single-instance ownership of the command side; foldstream/cluster replaces it ---

    def _take_back(self, partition: int, error: FoldstreamError) -> None:
        """Assign a partition the handler gave up after a failed transaction again, in the
        background. Not a fenced one: another instance writes it, which a single instance
        should not fight over (two instances with one service name is a deployment mistake)."""
        if isinstance(error, PartitionFenced):
            log.error("partition %d: %s; not taking it back", partition, error)
            return
        task = asyncio.get_running_loop().create_task(self._assign_until_done(partition))
        self._retaking.add(task)
        task.add_done_callback(self._retaking.discard)

    async def _assign_until_done(self, partition: int) -> None:
        while self.handler is not None:
            try:
                await asyncio.to_thread(self.handler.assign, [partition])
                return
            except FoldstreamError as exc:
                log.warning("taking partition %d back failed (%s); retrying in 1 s", partition, exc)
                await asyncio.sleep(1.0)

    # --- end of single-instance ownership ---

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready when every store has applied its source topic up to the end."""
        if self.readers is None or self.runner is None:
            return False, {"reason": "starting"}
        failure = self.runner.failure()
        if failure:
            return False, {"reason": failure}
        lag: dict[str, int] = {}
        for projection in self.service.projections:
            topic = projection.source_topic(self.settings.events_topic)
            ends = self._ends[topic].ends(timeout=1.0)
            applied = self.readers.next_offsets(projection.store)
            lag[projection.store] = sum(
                self._lag(topic, p, applied[p], end) for p, end in ends.items()
            )
        return all(v == 0 for v in lag.values()), {"lag": lag}

    def _lag(self, topic: str, partition: int, applied: int, end: int) -> int:
        """``end - applied``, or 0 when only offsets without records (transaction markers) lie
        between them; a span found empty is remembered until the offsets move."""
        if end <= applied or self._empty_spans.get((topic, partition)) == (applied, end):
            return 0
        bootstrap = self.settings.bootstrap_servers
        if holds_records(bootstrap, topic, partition, applied, end, timeout=1.0):
            return end - applied
        self._empty_spans[(topic, partition)] = (applied, end)
        return 0

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        from foldstream.spark import spark_session

        settings = self.settings
        layout = await asyncio.to_thread(self.provision)
        self.handler = CommandHandler(
            aggregates=self.service.aggregates,
            bootstrap=settings.bootstrap_servers,
            topic=settings.events_topic,
            partitions=settings.partitions,
            linger_ms=settings.linger_ms,
            fetch_wait_max_ms=settings.fetch_wait_max_ms,
            transactional_id_prefix=settings.events_topic,
            on_released=self._take_back,
        )
        self.handler.start()
        # A single instance owns every partition (until foldstream/cluster assigns them).
        replayed = await asyncio.to_thread(self.handler.assign, range(settings.partitions))
        log.info("command handler rebuilt aggregates from %d events", replayed)
        spark = await asyncio.to_thread(spark_session, settings.spark_master, settings.service)
        self.runner = ProjectionRunner(
            spark=spark,
            settings=settings,
            service_path=self.service_path,
            projections=self.service.projections,
            partitions=layout,
        )
        await asyncio.to_thread(self.runner.start)
        self._ends = {
            topic: EndOffsets(settings.bootstrap_servers, topic, list(range(count)))
            for topic, count in layout.items()
        }
        self.readers = StoreReaders(
            settings.state_dir,
            {
                p.store: (layout[p.source_topic(settings.events_topic)], p.partitioner)
                for p in self.service.projections
            },
        )
        try:
            yield
        finally:
            readers, self.readers = self.readers, None
            readers.close()
            self.runner.stop()
            for ends in self._ends.values():
                ends.close()
            for task in self._retaking:
                task.cancel()
            self.handler.close()
            spark.stop()
