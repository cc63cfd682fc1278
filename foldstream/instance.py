"""One running instance of a service: command handler, Spark projections and query API.

Resources are opened in the Starlette lifespan and closed in reverse order; the HTTP server
stops answering before the stores are closed, so a stopping instance never serves a lookup from
a closed store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from foldstream import auth
from foldstream.api_docs import api_docs_routes, foldstream_version
from foldstream.changelog import StandbyReplicas, StoreCatalog
from foldstream.cluster import ClusterNode
from foldstream.commands import CommandHandler, Retention, command_arguments
from foldstream.commands.http import command_routes
from foldstream.commands.ownership import CommandPartitions
from foldstream.commands.snapshot_store import SnapshotStore
from foldstream.dashboard import dashboard_routes
from foldstream.direct_routes import DirectRoutes
from foldstream.end_probes import ProbedEnds
from foldstream.generations import QueryStores, ServiceGenerations
from foldstream.http_input import InputLimits
from foldstream.kafka_client import installed as kafka_properties
from foldstream.metrics import CONTENT_TYPE, InstanceMetrics, listen_to_progress
from foldstream.openapi import openapi_document, store_reads
from foldstream.preflight import kept_projections, prepare, store_layouts
from foldstream.projections.graph import is_hidden
from foldstream.projections.runner import ProjectionRunner
from foldstream.projections.versions import logical_name
from foldstream.query_api import StoreReaders, query_routes
from foldstream.query_api.fast_lookup import FastLookups
from foldstream.query_api.rebuild_http import rebuild_routes
from foldstream.query_api.stores import StoreInfo
from foldstream.responses import error_response
from foldstream.route_params import METRICS, refusing_unknown
from foldstream.routing import Locator
from foldstream.service import Service
from foldstream.settings import AGGREGATE_STORE, Settings
from foldstream.state.applied import AppliedOffsets
from foldstream.state.host import StoreHost
from foldstream.state.local import LocalStores

log = logging.getLogger(__name__)
HOT_PATHS = ("/commands/{aggregate}/{aggregate_id}/{command}", "/stores/{store}/keys")


class Instance:
    """Builds the ASGI app of ``service`` (found at import path ``service_path``).

    ``authentication``: the middleware requiring credentials, around every route (hot paths
    included); by default the bearer token of ``settings`` and the service's own
    (:func:`foldstream.auth.configured`).
    """

    def __init__(
        self,
        *,
        service: Service,
        service_path: str,
        settings: Settings,
        authentication: Sequence[Middleware] | None = None,
    ) -> None:
        self.service = service
        self.service_path = service_path
        self.settings = settings
        self.handler: CommandHandler | None = None
        self.readers: StoreReaders | None = None
        self.node: ClusterNode | None = None
        self._prepared: dict[str, int] | None = None
        #: The physical stores, their layouts and formats (set at each start; gains rebuilds).
        self.catalog = StoreCatalog()
        #: Where queries with a consistency token wait for the copies they read.
        self.applied = AppliedOffsets()
        self.metrics = InstanceMetrics(
            command_counts=lambda: self.handler.counts() if self.handler else None,
            cluster=lambda: self.node.figures() if self.node else None,
        )
        for projection in service.projections:
            if projection.kind == "windowed":  # its late records counted from 0, not absent
                self.metrics.late_records.labels(projection.store)
        if authentication is None:
            authentication = auth.configured(settings, service.authentication)
        #: Every route of the app (each declares its query parameters: foldstream.route_params).
        self.routes = self._routes(authentication)
        app = Starlette(
            routes=self.routes,
            lifespan=self._lifespan,
            exception_handlers={HTTPException: _http_error},
        )
        self.app = front(
            app,
            readers=lambda: self.readers,
            locator=lambda: self.node,
            limits=settings.limits,
            authentication=authentication,
        )

    def _routes(self, authentication: Sequence[Middleware]) -> list[BaseRoute]:
        """The commands, the queries, ``/metrics``, the API's documents and the dashboard."""
        settings, service, limits = self.settings, self.service, self.settings.limits
        document = openapi_document(
            title=service.name,
            version=foldstream_version(),
            commands=command_arguments(service.aggregates),
            stores={  # a store's newest version: all are of one kind
                logical_name(p.store): store_reads(p)
                for p in service.projections
                if not is_hidden(p)
            },
            limits=limits,
            commands_secured=bool(authentication),
            queries_secured=any(auth.protects_queries(m) for m in authentication),
        )
        return [
            *command_routes(
                lambda: self._require(self.handler),
                lambda: self._require(self.node),
                limits=limits,
            ),
            *query_routes(
                lambda: self._require(self.readers),
                lambda: self._require(self.node),
                self.readiness,
                lambda: self._require(self.node).snapshot(),
                limits=limits,
                consistency_wait_s=settings.consistency_wait_ms / 1000,
            ),
            *rebuild_routes(lambda: self._require(self.node).rebuilds),
            Route("/metrics", refusing_unknown(METRICS, self._metrics)),
            *api_docs_routes(document),
            *dashboard_routes(settings.url, limits),
        ]

    @staticmethod
    def _require(resource: Any) -> Any:
        if resource is None:
            raise RuntimeError("the instance is not started")
        return resource

    async def _metrics(self, request: Request) -> Response:
        """``GET /metrics``: the instance's metrics in Prometheus' text format."""
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    def prepare(self) -> dict[str, int]:
        """Install the Kafka client properties, create the service's topics (or check them)
        and check the local state against them (:func:`foldstream.preflight.prepare`);
        ``{topic: partitions}`` of every source topic. The lifespan does it unless it was done
        just before (``foldstream serve`` does it before it starts serving)."""
        self._prepared = prepare(self.service, self.settings)
        return self._prepared

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready when this instance serves every partition it owns, caught up."""
        if self.node is None:
            return False, {"reason": "starting"}
        return self.node.readiness()

    def member_id(self) -> str:
        """This instance's id in the cluster, kept in the state directory across restarts."""
        path = self.settings.state_dir / "instance-id"
        if path.exists():
            return path.read_text().strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        member_id = f"{self.settings.service}-{uuid.uuid4().hex[:8]}"
        path.write_text(member_id + "\n")
        return member_id

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Open the parts in order (each closed, in reverse, by the exit stack): the store host,
        the command side, Spark and the projections, the copies, the cluster node."""
        layout = self._prepared
        if layout is None:
            layout = await asyncio.to_thread(self.prepare)
        self._prepared = None  # a later start checks again
        layout = self._owned_topics(layout)
        self.catalog = StoreCatalog(store_layouts(self.service, self.settings))
        async with contextlib.AsyncExitStack() as stack:
            host = self._open_host(stack)  # closed after the queries stopped: no task writes
            self.handler, commands = self._open_commands(stack, host)
            runner = await self._open_projections(stack, host, layout)
            store_info = self._store_info(layout)
            local, node = await self._open_cluster(
                stack, host, runner, commands, layout, store_info
            )
            readers = StoreReaders(store_info, local, applied=self.applied, versions=node.versions)
            self.readers, self.node = readers, node
            try:
                yield
            finally:
                self.readers = self.node = self.handler = None

    def _owned_topics(self, layout: dict[str, int]) -> dict[str, int]:
        """``layout`` without the events topic when nothing reads or writes it here (a service
        whose stores all read other topics and that has no aggregates): no partitions to own."""
        events = self.settings.events_topic
        if self.service.aggregates or any(
            p.source_topic(events) == events for p in kept_projections(self.service, self.settings)
        ):
            return layout
        return {t: n for t, n in layout.items() if t != events}

    def _store_info(self, layout: dict[str, int]) -> dict[str, StoreInfo]:
        """What is queryable (hidden stores are not), with each store's source partitions."""
        events = self.settings.events_topic
        return {
            p.store: StoreInfo.of(p, p.source_topic(events), layout[p.source_topic(events)])
            for p in kept_projections(self.service, self.settings)
            if not is_hidden(p)
        }

    def _open_host(self, stack: contextlib.AsyncExitStack) -> StoreHost:
        host = StoreHost(
            state_dir=self.settings.state_dir,
            host=self.settings.store_host,
            on_task=self.metrics.observe_task,
            on_poison=self.metrics.observe_poison,
            on_applied=self.applied.applied,
            on_late=self.metrics.observe_late,
            formats=self.catalog.formats,
            unmapped=self.catalog.unmapped,
        )
        host.start()
        stack.callback(host.stop)
        return host

    def _open_commands(
        self, stack: contextlib.AsyncExitStack, host: StoreHost
    ) -> tuple[CommandHandler | None, CommandPartitions | None]:
        """The command handler and the partitions it takes, with its aggregate store on
        ``host``; none for a service without aggregates."""
        if not self.service.aggregates:
            return None, None
        settings = self.settings
        snapshots = SnapshotStore(
            host,
            bootstrap=settings.bootstrap_servers,
            changelog_topic=settings.changelog_topic(AGGREGATE_STORE),
        )
        stack.callback(snapshots.close)
        handler = CommandHandler(
            aggregates=self.service.aggregates,
            bootstrap=settings.bootstrap_servers,
            topic=settings.events_topic,
            partitions=settings.partitions,
            linger_ms=settings.linger_ms,
            fetch_wait_max_ms=settings.fetch_wait_max_ms,
            transactional_id_prefix=settings.events_topic,
            max_record_bytes=event_bytes_limit(settings.limits),
            snapshots=snapshots,
            cache_size=settings.aggregate_cache_size,
            retention=Retention(settings.idempotency_retention_s, settings.idempotency_max_keys),
        )
        handler.start()
        stack.callback(handler.close)
        commands = CommandPartitions(
            handler,
            fenced_wait_s=settings.session_timeout_ms / 1000,
            # The node starts after the command side: until then nothing is owned anyway.
            may_take=lambda: self.node is None or self.node.map.view_is_current(),
        )
        commands.start()
        stack.callback(commands.close)
        return handler, commands

    async def _open_projections(
        self, stack: contextlib.AsyncExitStack, host: StoreHost, layout: dict[str, int]
    ) -> ProjectionRunner:
        """A Spark session, its progress reported in the metrics, and the projections' runner
        (which starts no query before the cluster gives it partitions)."""
        from foldstream.spark import spark_session

        settings = self.settings
        spark = await asyncio.to_thread(spark_session, settings.spark_master, settings.service)
        stack.callback(spark.stop)
        stores_of = QueryStores(self.catalog, settings.service)  # rebuilds' queries too
        unlisten = await asyncio.to_thread(listen_to_progress, spark, self.metrics, stores_of)
        stack.callback(unlisten)
        runner = ProjectionRunner(
            spark=spark,
            settings=settings,
            host=host,
            service_path=self.service_path,
            projections=kept_projections(self.service, settings),
            partitions=layout,
        )
        await asyncio.to_thread(runner.start)
        stack.callback(runner.stop)
        return runner

    async def _open_cluster(
        self,
        stack: contextlib.AsyncExitStack,
        host: StoreHost,
        runner: ProjectionRunner,
        commands: CommandPartitions | None,
        layout: dict[str, int],
        store_info: dict[str, StoreInfo],
    ) -> tuple[LocalStores, ClusterNode]:
        """The source topics' end trackers, the standby copies, the local copies' reader and
        the cluster node that gives this member its partitions (and publishes ``store_info``,
        the queryable stores, in the cluster map)."""
        settings, stores = self.settings, self.catalog
        ends = {
            topic: ProbedEnds(settings.bootstrap_servers, topic, list(range(count)))
            for topic, count in layout.items()
        }
        for topic_ends in ends.values():
            stack.callback(topic_ends.close)
        replicas = StandbyReplicas(
            bootstrap=settings.bootstrap_servers,
            state_dir=settings.state_dir,
            layouts=stores,
            fetch_wait_max_ms=settings.background_fetch_wait_max_ms,
            on_applied=self.applied.applied,
        )
        stack.callback(replicas.close)
        local = LocalStores(
            settings.state_dir,
            host=host,
            standby_read=replicas.get,
            standby_offset=replicas.applied_offset,
            standby_scan=replicas.scan,
            formats=self.catalog.formats,
        )
        stack.callback(local.close)
        node = ClusterNode(
            settings=settings,
            member_id=self.member_id(),
            stores=stores,
            topics=layout,
            store_info={s: asdict(info) for s, info in store_info.items()},
            local=local,
            replicas=replicas,
            projections=runner,
            commands=commands,
            ends=ends,
            generations=ServiceGenerations(self.service, settings, runner, layout),
        )
        await asyncio.to_thread(node.start)
        # Leaving first: the HTTP server has stopped answering, then partitions move at once
        # to the other members, then the stores close.
        stack.callback(node.close)
        return local, node


def front(
    app: Starlette,
    *,
    readers: Callable[[], StoreReaders | None],
    locator: Callable[[], Locator | None],
    limits: InputLimits,
    authentication: Sequence[Middleware],
    hot_paths: Collection[str] = HOT_PATHS,
) -> FastLookups:
    """What a request meets before ``app``'s middleware and router: plain lookups are answered
    first (unless ``authentication`` may require credentials for them), then ``authentication``
    checks credentials, then commands and batch lookups go straight to their routes
    (``hot_paths``); everything else goes through Starlette."""
    return FastLookups(
        auth.wrap(DirectRoutes(app, hot_paths), authentication),
        readers=readers,
        locator=locator,
        limits=limits,
        enabled=not any(auth.protects_queries(m) for m in authentication),
    )


def event_bytes_limit(limits: InputLimits) -> int:
    """The largest event record a command may append: ``max_event_bytes``, lowered to fit a
    ``message.max.bytes`` configured below librdkafka's default (less room for framing)."""
    configured = kafka_properties().get("message.max.bytes", "")
    if not configured.isdigit():
        return limits.max_event_bytes
    return min(limits.max_event_bytes, int(configured) - 1_024)


async def _http_error(request: Request, exc: Exception) -> Response:
    """The router's 404 (no such path) and 405 (method not allowed) as JSON errors."""
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail, headers=dict(exc.headers or {}))
