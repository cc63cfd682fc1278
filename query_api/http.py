"""HTTP routes of the query side: stores, key lookups, owners, the cluster map, health.

Lookups and batch lookups are answered by :class:`~foldstream.query_api.answers.LookupAnswers`,
which the fast paths use too: these routes only read the request and send its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.errors import InvalidRequest, StoreNotFound
from foldstream.http_input import InputLimits
from foldstream.projections.versions import generation_of, version_of
from foldstream.query_api.answers import LookupAnswers, raw_path_of
from foldstream.query_api.consistency import has_token, token_header
from foldstream.query_api.stores import StoreReaders
from foldstream.responses import error_answer, error_response, to_response
from foldstream.route_params import CLUSTER, HEALTH, READY, STORES, refusing_unknown
from foldstream.routing import Locator

#: What the router answers for a path no route takes (the instance sends it as JSON too).
NOT_FOUND = error_answer(404, "Not Found")


def query_routes(
    readers: Callable[[], StoreReaders],
    locator: Callable[[], Locator],
    readiness: Callable[[], tuple[bool, dict[str, object]]],
    cluster: Callable[[], dict[str, Any]],
    *,
    limits: InputLimits | None = None,
    consistency_wait_s: float = 2.0,
) -> list[Route]:
    """Routes over the readers and locator returned by ``readers()`` and ``locator()`` (both
    opened in the app's lifespan), within ``limits``. A query with a consistency token waits
    up to ``consistency_wait_s`` for a copy that includes it (:mod:`.consistency`).

    ``readiness()`` says whether this instance serves everything it owns, caught up;
    ``cluster()`` is the cluster map published for smart clients.
    """
    routes = QueryRoutes(
        readers,
        LookupAnswers(readers, locator, limits),
        readiness,
        cluster,
        consistency_wait_s=consistency_wait_s,
    )
    # Lookups, batches and owners check their parameters where they read the request
    # (LookupAnswers, which the fast paths share); the others before they answer.
    return [
        Route("/stores", refusing_unknown(STORES, routes.list_stores)),
        Route("/stores/{store}/keys/{key:path}", routes.get_key),
        Route("/stores/{store}/owners/{key:path}", routes.owners),
        Route("/cluster", refusing_unknown(CLUSTER, routes.cluster_map)),
        Route("/stores/{store}/keys", routes.get_keys, methods=["POST"]),
        Route("/health", refusing_unknown(HEALTH, routes.health)),
        Route("/ready", refusing_unknown(READY, routes.ready)),
    ]


class QueryRoutes:
    """The query side's endpoints: each reads its request and sends what ``answers`` (or the
    readers, the readiness check and the cluster map) says."""

    def __init__(
        self,
        readers: Callable[[], StoreReaders],
        answers: LookupAnswers,
        readiness: Callable[[], tuple[bool, dict[str, object]]],
        cluster: Callable[[], dict[str, Any]],
        *,
        consistency_wait_s: float,
    ) -> None:
        self.readers = readers
        self.answers = answers
        self.readiness = readiness
        self.cluster = cluster
        self.consistency_wait_s = consistency_wait_s

    async def list_stores(self, request: Request) -> JSONResponse:
        stores = self.readers()
        return JSONResponse({"stores": [store_entry(stores, name) for name in stores.names]})

    async def get_key(self, request: Request) -> Response:
        scope, answers = request.scope, self.answers
        path, query, header = raw_path_of(scope), scope["query_string"], token_header(scope)
        if header is None and not has_token(query):
            return to_response(answers.lookup(path, query) or NOT_FOUND)
        answer = await answers.lookup_after(path, query, header, self.consistency_wait_s)
        return to_response(answer or NOT_FOUND)

    async def get_keys(self, request: Request) -> Response:
        scope, answers = request.scope, self.answers
        try:
            body = await answers.limits.read_body(request)
        except InvalidRequest as exc:
            return error_response(exc.status, str(exc))
        path, query, header = raw_path_of(scope), scope["query_string"], token_header(scope)
        if header is None and not has_token(query):
            return to_response(answers.batch(path, query, body) or NOT_FOUND)
        answer = await answers.batch_after(path, query, body, header, self.consistency_wait_s)
        return to_response(answer or NOT_FOUND)

    async def owners(self, request: Request) -> Response:
        scope = request.scope
        try:
            target = self.answers.owner_target(raw_path_of(scope), scope["query_string"])
        except InvalidRequest as exc:
            return error_response(exc.status, str(exc))
        if target is None:
            return to_response(NOT_FOUND)
        store, key = target
        stores = self.readers()
        try:
            version = stores.serving(store)
        except StoreNotFound as exc:
            return error_response(404, str(exc))
        info = stores.info(version)
        partition = info.partition_of(key)
        owner = cluster_partition(self.cluster(), info.topic, partition)
        return JSONResponse({"store": store, "key": key.decode(), "partition": partition, **owner})

    async def cluster_map(self, request: Request) -> JSONResponse:
        return JSONResponse(self.cluster())

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "alive"})

    async def ready(self, request: Request) -> JSONResponse:
        is_ready, details = self.readiness()
        return JSONResponse({"ready": is_ready, **details}, status_code=200 if is_ready else 503)


def cluster_partition(cluster: dict[str, Any], topic: str, partition: int) -> dict[str, Any]:
    """``{"active": url | None, "standbys": [{"url", "lag"}]}`` of one partition of ``topic``."""
    entry = cluster.get("partitions", {}).get(topic, {}).get(str(partition), {})
    return {"active": entry.get("active"), "standbys": entry.get("standbys", [])}


def store_entry(stores: StoreReaders, name: str) -> dict[str, Any]:
    """What ``GET /stores`` says of store ``name``: the info of the version answering its
    queries, and each version's state and progress (:mod:`foldstream.cluster.versions`)."""
    serving = stores.serving(name)
    info = stores.info(serving)
    return {
        "name": name,
        "partitions": info.partitions,
        "partitioner": info.partitioner,
        "kind": info.kind,
        "version": version_of(serving),
        "generation": generation_of(serving),
        "versions": [asdict(v) for v in stores.versions(name)],
    }
