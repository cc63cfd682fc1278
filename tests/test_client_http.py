"""foldstream.client against an HTTP server that misbehaves on purpose (uvicorn, real sockets):
the hop limit, Retry-After, commands never resent when they may have been appended, and
credentials kept from hosts outside the cluster. The well-behaved cluster is in
``test_client_cluster.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.broker import free_port
from foldstream.client import (
    AsyncFoldstreamClient,
    FoldstreamClient,
    OutcomeUnknown,
    TooManyRedirects,
    Unavailable,
)
from foldstream.client.flows import Send, retry_after


class Misbehaving:
    """A server whose answers the tests choose; it counts what it was asked."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.asked: list[tuple[str, str, str | None]] = []
        self.keys: list[str | None] = []  # the Idempotency-Key of each command
        self.busy_left = 0
        self.honours_keys = False  # whether the map says the instances honour keys
        self.unknown_left = 0  # commands to /commands/a/flaky/c answered "outcome unknown"

    def cluster(self) -> dict[str, Any]:
        return {
            "generation": 1,
            "settled": True,
            "instances": [{"id": "only", "url": self.url}],
            "partitions": {"t": {"0": {"active": self.url, "standbys": []}}},
            "stores": {"s": {"topic": "t", "partitions": 1, "partitioner": "murmur2"}},
            "commands": {"topic": "t", "partitions": 1}
            | ({"idempotency_retention_s": 60} if self.honours_keys else {}),
        }

    async def answer(self, request: Request) -> Response:
        path = request.url.path
        self.asked.append((request.method, path, request.headers.get("authorization")))
        if path == "/cluster":
            return JSONResponse(self.cluster())
        if path == "/stores/s/keys/loop":
            return Response(status_code=307, headers={"location": f"{self.url}{path}"})
        if path == "/stores/s/keys/away":
            return Response(status_code=307, headers={"location": "http://127.0.0.2:9/x"})
        if path == "/stores/s/keys/busy" and self.busy_left > 0:
            self.busy_left -= 1
            return JSONResponse({"error": "rebalancing", "partition": 0}, 503, {"retry-after": "1"})
        if path.startswith("/stores/s/keys/"):
            served = {"instance": "only", "role": "active", "partition": 0, "lag": 0}
            return JSONResponse({"key": path.rsplit("/", 1)[1], "value": 1, "served_by": served})
        if path.startswith("/commands/"):
            self.keys.append(request.headers.get("idempotency-key"))
        if path == "/commands/a/unknown/c" or (path == "/commands/a/flaky/c" and self.unknown_left):
            self.unknown_left -= 1
            return JSONResponse({"error": "outcome unknown"}, 503, {"retry-after": "0"})
        if path == "/commands/a/flaky/c":
            position = {"partition": 0, "offset": 7}
            return JSONResponse({"events": [], "position": position, "token": "f1-0-7-0"})
        if path == "/commands/a/fenced/c":
            return JSONResponse({"error": "not the owner", "partition": 0}, 503)
        return JSONResponse({"error": "no"}, 404)


@pytest.fixture(scope="module")
def server() -> Iterator[Misbehaving]:
    misbehaving = Misbehaving()
    app = Starlette(routes=[Route("/{path:path}", misbehaving.answer, methods=["GET", "POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=misbehaving.port, log_level="warning")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, name="misbehaving-server")
    thread.start()
    deadline = time.monotonic() + 30
    while not running.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    yield misbehaving
    running.should_exit = True
    thread.join(30)


def test_a_redirect_loop_stops_at_the_hop_limit(server: Misbehaving) -> None:
    server.asked.clear()
    with FoldstreamClient(server.url, max_hops=3) as client, pytest.raises(TooManyRedirects):
        client.get("s", "loop")
    assert [p for _, p, _ in server.asked].count("/stores/s/keys/loop") == 4  # 1 + 3 hops


def test_a_redirect_outside_the_cluster_is_refused_and_gets_no_credentials(
    server: Misbehaving,
) -> None:
    with FoldstreamClient(server.url, token="secret") as client:
        with pytest.raises(TooManyRedirects, match="not a member"):
            client.get("s", "away")
        assert (
            client._core.headers(Send("GET", "http://127.0.0.2:9/x")).get("authorization") is None
        )
    assert all(auth == "Bearer secret" for _, _, auth in server.asked if auth is not None)


def test_503s_are_retried_after_their_retry_after(server: Misbehaving) -> None:
    server.busy_left = 2
    server.asked.clear()
    started = time.monotonic()
    with FoldstreamClient(server.url) as client:
        assert client.get("s", "busy") == 1
    busy = [p for _, p, _ in server.asked if p == "/stores/s/keys/busy"]
    assert len(busy) == 3
    # Two waits of the one second each 503 asked for (a lower bound: no upper one is asserted).
    assert time.monotonic() - started >= 2.0


def test_the_deadline_turns_503s_into_unavailable(server: Misbehaving) -> None:
    server.busy_left = 1_000
    with FoldstreamClient(server.url, retry_timeout=1.5) as client, pytest.raises(Unavailable):
        client.get("s", "busy")
    server.busy_left = 0


def test_a_command_is_not_resent_when_it_may_have_been_appended(server: Misbehaving) -> None:
    server.asked.clear()
    with FoldstreamClient(server.url, retry_timeout=3) as client:
        with pytest.raises(OutcomeUnknown):
            client.command("a", "unknown", "c", {})
        with pytest.raises(Unavailable):  # a 503 naming the partition: safe, retried
            client.command("a", "fenced", "c", {})
    commands = [p for m, p, _ in server.asked if m == "POST"]
    assert commands.count("/commands/a/unknown/c") == 1
    assert commands.count("/commands/a/fenced/c") > 1


def test_a_command_of_unknown_outcome_is_resent_with_its_key_when_the_instances_honour_it(
    server: Misbehaving,
) -> None:
    server.honours_keys, server.unknown_left = True, 2
    server.keys.clear()
    try:
        with FoldstreamClient(server.url, retry_timeout=3) as client:
            assert client.command("a", "flaky", "c", {}).position.offset == 7
            assert len(server.keys) == 3 and len(set(server.keys)) == 1  # one key, 3 attempts
            with pytest.raises(OutcomeUnknown) as unknown:
                client.command("a", "unknown", "c", {}, idempotency_key="mine-1")
            assert unknown.value.idempotency_key == "mine-1" and "mine-1" in str(unknown.value)
            assert server.keys[3:] == ["mine-1"] * (len(server.keys) - 3) and len(server.keys) > 5
    finally:
        server.honours_keys = False


def test_the_async_client_behaves_alike(server: Misbehaving) -> None:
    async def run() -> None:
        async with AsyncFoldstreamClient(server.url, max_hops=2) as client:
            assert (await client.get("s", "k")) == 1
            with pytest.raises(TooManyRedirects):
                await client.get("s", "loop")
            with pytest.raises(OutcomeUnknown):
                await client.command("a", "unknown", "c")

    asyncio.run(run())


def test_connection_refused_is_retried_then_unavailable() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with FoldstreamClient(nobody, retry_timeout=1.0) as client, pytest.raises(Unavailable):
        client.get("s", "k")


@pytest.mark.parametrize(
    ("header", "expected"),
    [("2", 2.0), ("0", 0.0), ("3600", 10.0), ("soon", 1.0), (None, 1.0)],
)
def test_retry_after_is_read_and_bounded(header: str | None, expected: float) -> None:
    headers = {} if header is None else {"retry-after": header}
    assert retry_after(httpx.Response(503, headers=headers)) == expected


def test_retry_after_as_an_http_date() -> None:
    header = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 4))
    assert 2.0 <= retry_after(httpx.Response(503, headers={"retry-after": header})) <= 4.0
