"""HTTP routes of the query side: stores, key lookups, health and readiness."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.errors import StoreNotFound
from foldstream.query_api.batch import batch_route
from foldstream.query_api.stores import StoreReaders
from foldstream.responses import error_response


def query_routes(
    readers: Callable[[], StoreReaders], readiness: Callable[[], tuple[bool, dict[str, object]]]
) -> list[Route]:
    """Routes over the readers returned by ``readers()`` (opened in the app's lifespan).

    ``readiness()`` says whether every store is open and caught up, with details.
    """

    async def list_stores(request: Request) -> JSONResponse:
        layout = readers().layout
        return JSONResponse(
            {
                "stores": [
                    {"name": s, "partitions": n, "partitioner": p} for s, (n, p) in layout.items()
                ]
            }
        )

    async def get_key(request: Request) -> Response:
        store, key = request.path_params["store"], request.path_params["key"]
        try:
            value = readers().get(store, key.encode())
        except StoreNotFound as exc:
            return error_response(404, str(exc))
        if value is None:
            return error_response(404, f"no key {key!r} in store {store!r}")
        # The stored bytes are JSON already: answer without decoding and re-encoding them.
        body = b'{"key":' + json.dumps(key).encode() + b',"value":' + value + b"}"
        return Response(body, media_type="application/json")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "alive"})

    async def ready(request: Request) -> JSONResponse:
        is_ready, details = readiness()
        return JSONResponse({"ready": is_ready, **details}, status_code=200 if is_ready else 503)

    return [
        Route("/stores", list_stores),
        Route("/stores/{store}/keys/{key:path}", get_key),
        batch_route(readers),
        Route("/health", health),
        Route("/ready", ready),
    ]
