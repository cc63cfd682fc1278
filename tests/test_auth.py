"""Requiring credentials: the middleware, its settings, and the fast paths stepping aside, on
real uvicorn servers (the instance's own front, :func:`foldstream.instance.front`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request

from foldstream.auth import RequireCredentials, bearer_token, configured, protects_queries
from foldstream.errors import ConfigurationError
from foldstream.http_input import InputLimits
from foldstream.instance import front
from foldstream.query_api import query_routes
from foldstream.query_api.lookup_protocol import lookup_protocol
from foldstream.settings import Settings
from foldstream.testing.asgi import uvicorn_thread
from tests.test_batch_lookups import write_store
from tests.test_fast_lookup import OwnsPartitionZero
from tests.test_hostile_http import exchange
from tests.test_lookup_protocol import _key

TOKEN = "s3cret-token"


def _get(path: str, authorization: str | None = None) -> bytes:
    extra = f"Authorization: {authorization}\r\n" if authorization else ""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def _post(path: str, body: bytes, authorization: str | None = None) -> bytes:
    extra = f"Authorization: {authorization}\r\n" if authorization else ""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[Any]:
    """``serve(authentication)``: the lookup routes behind the instance's front, on uvicorn
    with the lookup protocol; yields its URL and the paths that reached the routes."""
    readers = write_store(tmp_path, {"k-0": b'{"n":0}', "k-1": b'{"n":1}', "k-2": b'{"n":2}'})
    locator = OwnsPartitionZero()
    reached: list[str] = []
    app = Starlette(
        routes=query_routes(lambda: readers, lambda: locator, lambda: (True, {}), dict),
        middleware=[Middleware(_Counted, reached=reached)],
    )
    stack: list[Any] = []

    def serve(authentication: list[Middleware]) -> str:
        lookups = front(
            app,
            readers=lambda: readers,
            locator=lambda: locator,
            limits=InputLimits(),
            authentication=authentication,
            hot_paths=["/stores/{store}/keys"],
        )
        server = uvicorn_thread(lookups, http=lookup_protocol(lookups))
        stack.append(server)
        return server.__enter__()

    try:
        yield serve, reached
    finally:
        for server in stack:
            server.__exit__(None, None, None)
        readers.close()


class _Counted:
    """Records the path of every request that reached the app's middleware stack."""

    def __init__(self, app: Any, reached: list[str]) -> None:
        self.app, self.reached = app, reached

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.reached.append(scope["path"])
        await self.app(scope, receive, send)


def _lookup_path() -> str:
    return f"/stores/kv/keys/{_key(0)}"  # a key of partition 0: served here


def test_commands_need_the_token_and_lookups_stay_on_the_fast_path(served: Any) -> None:
    serve, reached = served
    url = serve(configured(Settings(auth_token=TOKEN), None))
    status, headers, body = exchange(url, _post("/commands/product/a/sell", b"{}"))
    assert status == 401 and b"Authorization" in json.loads(body)["error"].encode()
    assert headers[b"www-authenticate"] == b'Bearer realm="foldstream"'
    wrong = exchange(url, _post("/commands/product/a/sell", b"{}", "Bearer nope"))
    assert wrong[0] == 401
    # With the token the request passes the middleware (no command route here: 404).
    assert exchange(url, _post("/commands/product/a/sell", b"{}", f"Bearer {TOKEN}"))[0] == 404
    reached.clear()
    assert exchange(url, _get(_lookup_path()))[0] == 200
    assert reached == []  # answered in the protocol, as without authentication


def test_queries_protected_turn_the_fast_paths_off(served: Any) -> None:
    serve, reached = served
    url = serve(configured(Settings(auth_token=TOKEN, auth_queries=True), None))
    for request in (_get(_lookup_path()), _post("/stores/kv/keys", b'["k-0"]'), _get("/stores")):
        status, _, body = exchange(url, request)
        assert status == 401, (request, body)
    reached.clear()
    status, _, body = exchange(url, _get(_lookup_path(), f"Bearer {TOKEN}"))
    assert status == 200 and json.loads(body)["key"] == _key(0)
    assert reached == [_lookup_path()]  # through the app, past the middleware
    status, _, body = exchange(url, _post("/stores/kv/keys", b'["k-0"]', f"Bearer {TOKEN}"))
    assert status == 200 and "k-0" in json.dumps(json.loads(body))
    for path in ("/health", "/ready"):
        assert exchange(url, _get(path))[0] == 200, path


def test_a_service_plugs_its_own_check_or_middleware(served: Any) -> None:
    serve, reached = served

    async def only_alice(request: Request) -> bool:
        return request.headers.get("x-user") == "alice"

    check = Middleware(RequireCredentials, check=only_alice, queries=True, open_paths=())
    url = serve([check])
    assert exchange(url, _get("/health"))[0] == 401  # no open paths
    alice = f"GET {_lookup_path()} HTTP/1.1\r\nHost: x\r\nX-User: alice\r\n\r\n".encode()
    assert exchange(url, alice)[0] == 200

    class Deny:  # any middleware class of the service's own
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == _lookup_path():
                await send({"type": "http.response.start", "status": 403, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            await self.app(scope, receive, send)

    assert protects_queries(Middleware(Deny))  # unknown: the fast paths step aside
    url = serve([Middleware(Deny)])
    assert exchange(url, _get(_lookup_path()))[0] == 403
    reached.clear()
    assert exchange(url, _get(f"/stores/kv/keys/{_key(1)}"))[0] == 307
    assert reached == [f"/stores/kv/keys/{_key(1)}"]  # through the app: no fast path


def test_settings_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\n")
    monkeypatch.setenv("FOLDSTREAM_AUTH_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("FOLDSTREAM_AUTH_QUERIES", "true")
    monkeypatch.setenv("FOLDSTREAM_AUTH_OPEN_PATHS", "/health, /cluster")
    monkeypatch.setenv("FOLDSTREAM_MAX_BODY_BYTES", "1000")
    settings = Settings.from_env()
    assert settings.auth_queries and settings.auth_open_paths == ("/health", "/cluster")
    assert settings.limits.max_body_bytes == 1000
    assert TOKEN not in repr(Settings(auth_token=TOKEN))
    (layer,) = configured(settings, None)
    assert layer.kwargs["queries"] and protects_queries(layer)
    request = Request({"type": "http", "headers": [(b"authorization", f"Bearer {TOKEN}".encode())]})
    assert layer.kwargs["check"](request)
    assert not bearer_token(TOKEN)(Request({"type": "http", "headers": []}))
    # Settings handed to granian's worker as JSON come back whole.
    handed = json.loads(json.dumps(asdict(settings), default=str))
    assert Settings(**handed).limits == settings.limits
    token_file.write_text("")
    with pytest.raises(ConfigurationError, match="empty"):
        configured(settings, None)
    with pytest.raises(ConfigurationError):
        bearer_token("two words")
    monkeypatch.setenv("FOLDSTREAM_AUTH_QUERIES", "maybe")
    with pytest.raises(ConfigurationError, match="AUTH_QUERIES"):
        Settings.from_env()
