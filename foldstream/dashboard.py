"""``GET /ui/``: a page showing the cluster as this instance sees it.

The members, the partition map (active owner and standby copies with their lag, per topic), the
stores with a key lookup, and this instance's projection figures from ``/metrics``, refreshed
every 2 s. The page's files are in the package (``foldstream/assets/ui``), open like the
probes; what it shows comes from ``/cluster``, ``/stores`` and ``/metrics``, which need
credentials when queries do (the page asks for a token on a 401).

A browser may not read an answer from another instance (no CORS), so the page's lookup goes
through ``GET /ui/api/lookup/{store}/{key}``: this instance asks the cluster with
:class:`~foldstream.client.AsyncFoldstreamClient` (routed by the map, redirects followed,
the caller's ``Authorization`` passed on) and returns the answer and its status.
"""

from __future__ import annotations

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from foldstream.api_docs import asset_files
from foldstream.client import AsyncFoldstreamClient, ClientError
from foldstream.errors import InvalidRequest
from foldstream.http_input import InputLimits
from foldstream.responses import error_response
from foldstream.route_params import UI, UI_LOOKUP, RefusingUnknown

_LOOKUP = b"/ui/api/lookup/"


def dashboard_routes(url: str, limits: InputLimits, timeout: float = 10.0) -> list[BaseRoute]:
    """The page (``/ui/``) and its lookup, asking the cluster through this instance at
    ``url`` (its advertised URL)."""

    async def lookup(request: Request) -> Response:
        raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
        try:
            limits.check_url(raw, request.scope["query_string"])
            if request.scope["query_string"]:
                UI_LOOKUP.checked(request.scope["query_string"])
            store, _, key = raw[len(_LOOKUP) :].partition(b"/")
            name = limits.name(store, "store name")
            wanted = limits.key(key).decode()
        except InvalidRequest as exc:
            return error_response(exc.status, str(exc))
        credentials = request.headers.get("authorization")
        forwarded = {"authorization": credentials} if credentials else None
        async with (
            httpx.AsyncClient(timeout=timeout, headers=forwarded) as http,
            AsyncFoldstreamClient(url, retry_timeout=timeout, http=http) as client,
        ):
            try:
                found = await client.lookup(name, wanted)
            except ClientError as exc:
                return JSONResponse(exc.body or {"error": str(exc)}, status_code=exc.status or 503)
        return JSONResponse(found.model_dump(), status_code=200)

    return [
        Route("/ui/api/lookup/{store}/{key:path}", lookup),
        Mount("/ui", RefusingUnknown(asset_files("ui"), UI), name="ui"),
    ]
