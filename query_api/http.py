"""HTTP routes of the query side: stores, key lookups, owners, the cluster map, health."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.errors import StoreNotFound
from foldstream.query_api.batch import batch_route
from foldstream.query_api.stores import StoreReaders
from foldstream.responses import error_response
from foldstream.routing import Local, Locator, Redirect, parse_max_lag, redirect, unavailable


def query_routes(
    readers: Callable[[], StoreReaders],
    locator: Callable[[], Locator],
    readiness: Callable[[], tuple[bool, dict[str, object]]],
    cluster: Callable[[], dict[str, Any]],
) -> list[Route]:
    """Routes over the readers and locator returned by ``readers()`` and ``locator()`` (both
    opened in the app's lifespan).

    ``readiness()`` says whether this instance serves everything it owns, caught up;
    ``cluster()`` is the cluster map published for smart clients.
    """

    async def list_stores(request: Request) -> JSONResponse:
        layout = readers().layout
        return JSONResponse(
            {
                "stores": [
                    {"name": s, "partitions": i.partitions, "partitioner": i.partitioner}
                    for s, i in layout.items()
                ]
            }
        )

    async def get_key(request: Request) -> Response:
        store, key = request.path_params["store"], request.path_params["key"]
        try:
            max_lag = parse_max_lag(request)
        except ValueError as exc:
            return error_response(400, f"max_lag must be a non-negative integer: {exc}")
        stores = readers()
        try:
            info = stores.info(store)
        except StoreNotFound as exc:
            return error_response(404, str(exc))
        raw_key = key.encode()
        partition = stores.partition(store, raw_key)
        location = locator().locate(info.topic, partition, max_lag=max_lag)
        if isinstance(location, Redirect):
            return redirect(request, location)
        if not isinstance(location, Local):
            return unavailable(location)
        value = stores.get(store, partition, raw_key, standby=location.role == "standby")
        served_by = served_by_json(location, partition)
        if value is None:
            body = (
                b'{"error":'
                + json.dumps(f"no key {key!r} in store {store!r}").encode()
                + b',"served_by":'
                + served_by
                + b"}"
            )
            return Response(body, status_code=404, media_type="application/json")
        return Response(found_body(key, value, served_by), media_type="application/json")

    async def owners(request: Request) -> JSONResponse:
        store, key = request.path_params["store"], request.path_params["key"]
        stores = readers()
        try:
            info = stores.info(store)
        except StoreNotFound as exc:
            return error_response(404, str(exc))
        partition = stores.partition(store, key.encode())
        owner = cluster_partition(cluster(), info.topic, partition)
        return JSONResponse({"store": store, "key": key, "partition": partition, **owner})

    async def cluster_map(request: Request) -> JSONResponse:
        return JSONResponse(cluster())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "alive"})

    async def ready(request: Request) -> JSONResponse:
        is_ready, details = readiness()
        return JSONResponse({"ready": is_ready, **details}, status_code=200 if is_ready else 503)

    return [
        Route("/stores", list_stores),
        Route("/stores/{store}/keys/{key:path}", get_key),
        Route("/stores/{store}/owners/{key:path}", owners),
        Route("/cluster", cluster_map),
        batch_route(readers, locator),
        Route("/health", health),
        Route("/ready", ready),
    ]


def served_by_json(location: Local, partition: int) -> bytes:
    """The ``served_by`` object of a lookup answered here: instance, role, partition, lag."""
    return json.dumps(
        {
            "instance": location.instance,
            "role": location.role,
            "partition": partition,
            "lag": location.lag,
        }
    ).encode()


def found_body(key: str, value: bytes, served_by: bytes) -> bytes:
    """The body of a lookup's 200 answer. The stored bytes are JSON already: they are answered
    without decoding and re-encoding them."""
    return (
        b'{"key":'
        + json.dumps(key).encode()
        + b',"value":'
        + value
        + b',"served_by":'
        + served_by
        + b"}"
    )


def cluster_partition(cluster: dict[str, Any], topic: str, partition: int) -> dict[str, Any]:
    """``{"active": url | None, "standbys": [{"url", "lag"}]}`` of one partition of ``topic``."""
    entry = cluster.get("partitions", {}).get(topic, {}).get(str(partition), {})
    return {"active": entry.get("active"), "standbys": entry.get("standbys", [])}
