"""``GET /openapi.json`` and ``GET /docs``: the service's API description and a page to read it.

The page is Swagger UI, served from files in the package (``foldstream/assets/docs``; refreshed
by ``scripts/vendor-swagger-ui.sh``): an instance loads nothing from elsewhere.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from foldstream.route_params import DOCS, OPENAPI, RefusingUnknown, refusing_unknown


def foldstream_version() -> str:
    """The installed foldstream's version (``0+unknown`` when it is not installed)."""
    try:
        return version("foldstream")
    except PackageNotFoundError:
        return "0+unknown"


def asset_files(name: str) -> StaticFiles:
    """The package's ``assets/<name>`` directory, served (``index.html`` for its root)."""
    return StaticFiles(packages=[("foldstream", f"assets/{name}")], html=True)


def api_docs_routes(document: dict[str, Any]) -> list[BaseRoute]:
    """``/openapi.json`` answering ``document``, and the ``/docs/`` page."""
    body = JSONResponse(document).body

    async def openapi(request: Request) -> Response:
        return Response(body, media_type="application/json")

    return [
        Route("/openapi.json", refusing_unknown(OPENAPI, openapi)),
        Mount("/docs", RefusingUnknown(asset_files("docs"), DOCS), name="docs"),
    ]
