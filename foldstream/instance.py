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
from starlette.routing import Route

from foldstream import auth
from foldstream.api_docs import api_docs_routes, foldstream_version
from foldstream.changelog import StandbyReplicas
from foldstream.cluster import ClusterNode
from foldstream.commands import CommandHandler, command_arguments
from foldstream.commands.http import command_routes
from foldstream.commands.ownership import CommandPartitions
from foldstream.commands.snapshot_store import SnapshotStore
from foldstream.dashboard import dashboard_routes
from foldstream.direct_routes import DirectRoutes
from foldstream.http_input import InputLimits
from foldstream.kafka_client import installed as kafka_properties
from foldstream.metrics import CONTENT_TYPE, InstanceMetrics, listen_to_progress
from foldstream.offsets import EndOffsets
from foldstream.openapi import openapi_document
from foldstream.preflight import prepare, store_layouts
from foldstream.projections.graph import is_hidden
from foldstream.projections.runner import ProjectionRunner, query_name
from foldstream.query_api import StoreReaders, query_routes
from foldstream.query_api.fast_lookup import FastLookups
from foldstream.query_api.stores import StoreInfo
from foldstream.responses import error_response
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
        #: Where queries with a consistency token wait for the copies they read.
        self.applied = AppliedOffsets()
        self.metrics = InstanceMetrics(
            command_counts=lambda: self.handler.counts() if self.handler else None,
            cluster=lambda: self.node.figures() if self.node else None,
        )
        for projection in service.projections:
            if projection.kind == "windowed":  # its late records counted from 0, not absent
                self.metrics.late_records.labels(projection.store)
        limits = settings.limits
        if authentication is None:
            authentication = auth.configured(settings, service.authentication)
        document = openapi_document(
            title=service.name,
            version=foldstream_version(),
            commands=command_arguments(service.aggregates),
            stores=[p.store for p in service.projections if not is_hidden(p)],
            limits=limits,
            commands_secured=bool(authentication),
            queries_secured=any(auth.protects_queries(m) for m in authentication),
        )
        app = Starlette(
            routes=[
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
                Route("/metrics", self._metrics),
                *api_docs_routes(document),
                *dashboard_routes(settings.url, limits),
            ],
            lifespan=self._lifespan,
            exception_handlers={HTTPException: _http_error},
        )
        self.app = front(
            app,
            readers=lambda: self.readers,
            locator=lambda: self.node,
            limits=limits,
            authentication=authentication,
        )

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
        from foldstream.spark import spark_session

        settings = self.settings
        layout = self._prepared
        if layout is None:
            layout = await asyncio.to_thread(self.prepare)
        self._prepared = None  # a later start checks again
        events = settings.events_topic
        if not self.service.aggregates and all(
            p.source_topic(events) != events for p in self.service.projections
        ):
            layout = {t: n for t, n in layout.items() if t != events}  # no partitions to own
        stores = store_layouts(self.service, settings)
        formats = {p.store: p.table_format for p in self.service.projections}
        async with contextlib.AsyncExitStack() as stack:
            # Closed after the queries stopped: no task writes through it any more.
            host = StoreHost(
                state_dir=settings.state_dir,
                host=settings.store_host,
                on_task=self.metrics.observe_task,
                on_poison=self.metrics.observe_poison,
                on_applied=self.applied.applied,
                on_late=self.metrics.observe_late,
                formats=formats,
            )
            host.start()
            stack.callback(host.stop)
            handler = commands = None
            if self.service.aggregates:
                snapshots = SnapshotStore(
                    host,
                    bootstrap=settings.bootstrap_servers,
                    changelog_topic=settings.changelog_topic(AGGREGATE_STORE),
                )
                stack.callback(snapshots.close)
                handler = CommandHandler(
                    aggregates=self.service.aggregates,
                    bootstrap=settings.bootstrap_servers,
                    topic=events,
                    partitions=settings.partitions,
                    linger_ms=settings.linger_ms,
                    fetch_wait_max_ms=settings.fetch_wait_max_ms,
                    transactional_id_prefix=events,
                    max_record_bytes=event_bytes_limit(settings.limits),
                    snapshots=snapshots,
                    cache_size=settings.aggregate_cache_size,
                )
                handler.start()
                stack.callback(handler.close)
                commands = CommandPartitions(handler)
                commands.start()
                stack.callback(commands.close)
            self.handler = handler
            spark = await asyncio.to_thread(spark_session, settings.spark_master, settings.service)
            stack.callback(spark.stop)
            stores_of = {
                query_name(settings.service, p.store): p.store for p in self.service.projections
            }
            unlisten = await asyncio.to_thread(listen_to_progress, spark, self.metrics, stores_of)
            stack.callback(unlisten)
            runner = ProjectionRunner(
                spark=spark,
                settings=settings,
                host=host,
                service_path=self.service_path,
                projections=self.service.projections,
                partitions=layout,
            )
            await asyncio.to_thread(runner.start)
            stack.callback(runner.stop)
            ends = {
                topic: EndOffsets(
                    settings.bootstrap_servers,
                    topic,
                    list(range(count)),
                    fetch_wait_max_ms=settings.background_fetch_wait_max_ms,
                )
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
                formats=formats,
            )
            stack.callback(local.close)
            store_info = {  # what is queryable: hidden stores are not
                p.store: StoreInfo.of(p, p.source_topic(events), layout[p.source_topic(events)])
                for p in self.service.projections
                if not is_hidden(p)
            }
            readers = StoreReaders(store_info, local, applied=self.applied)
            node = ClusterNode(
                settings=settings,
                member_id=self.member_id(),
                stores=stores,
                topics=layout,
                store_info={store: asdict(info) for store, info in store_info.items()},
                local=local,
                replicas=replicas,
                projections=runner,
                commands=commands,
                ends=ends,
            )
            await asyncio.to_thread(node.start)
            # Leaving first: the HTTP server has stopped answering, then partitions move at
            # once to the other members, then the stores close.
            stack.callback(node.close)
            self.readers, self.node = readers, node
            try:
                yield
            finally:
                self.readers = self.node = self.handler = None


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
