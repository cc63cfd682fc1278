"""The /docs and /ui pages' files are open; what they read needs credentials like any query."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from foldstream.auth import RequireCredentials, bearer_token, is_page_file


def test_page_files_are_told_apart_from_their_data() -> None:
    for path in ("/docs", "/docs/", "/docs/vendor/swagger-ui/swagger-ui.css", "/ui", "/ui/ui.js"):
        assert is_page_file(path), path
    for path in ("/ui/api/lookup/stock/k", "/openapi.json", "/cluster", "/uix", "/docsy"):
        assert not is_page_file(path), path


def test_with_queries_protected_only_the_page_files_stay_open() -> None:
    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = RequireCredentials(
        Starlette(routes=[Route("/{path:path}", ok)]), check=bearer_token("t"), queries=True
    )

    async def statuses() -> dict[str, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://i") as client:
            paths = ("/ui/", "/docs/docs.js", "/ui/api/lookup/s/k", "/openapi.json", "/health")
            return {path: (await client.get(path)).status_code for path in paths}

    assert asyncio.run(statuses()) == {
        "/ui/": 200,
        "/docs/docs.js": 200,
        "/ui/api/lookup/s/k": 401,
        "/openapi.json": 401,
        "/health": 200,
    }
