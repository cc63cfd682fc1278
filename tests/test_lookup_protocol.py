"""uvicorn with the lookup protocol answers byte for byte what uvicorn's own protocol answers with
the same app, over real sockets; requests the fast path does not take reach the app."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette

from foldstream.kafka import partition_for
from foldstream.query_api import query_routes
from foldstream.query_api.fast_lookup import FastLookups
from foldstream.query_api.lookup_protocol import lookup_protocol
from foldstream.testing.asgi import uvicorn_thread
from tests.test_batch_lookups import write_store
from tests.test_fast_lookup import OwnsPartitionZero

Response = tuple[bytes, dict[bytes, bytes], bytes]


def _exchange(url: str, request: bytes, responses: int = 1) -> list[Response]:
    """Send the raw ``request`` bytes to the server at ``url`` and read ``responses``
    responses (date header dropped: it is the only byte allowed to differ)."""
    address = urllib.parse.urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        connection.sendall(request)
        reader = connection.makefile("rb")
        head = request.startswith(b"HEAD ")
        return [_read_response(reader, head) for _ in range(responses)]


def _read_response(reader: Any, head: bool) -> Response:
    status = reader.readline().rstrip(b"\r\n")
    headers: dict[bytes, bytes] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.rstrip(b"\r\n").partition(b": ")
        headers[name.lower()] = value
    headers.pop(b"date", None)
    length = 0 if head else int(headers.get(b"content-length", b"0"))
    return status, headers, reader.read(length)


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[tuple[str, str, list[str]]]:
    """The same app on uvicorn's own protocol and on the lookup protocol, and the paths of the
    requests that reached the ASGI app (on the lookup protocol: those not answered in it)."""
    readers = write_store(tmp_path, {"k-0": b'{"n":0}', "k-1": b'{"n":1}', "k-2": b'{"n":2}'})
    locator = OwnsPartitionZero()
    routes = Starlette(
        routes=query_routes(lambda: readers, lambda: locator, lambda: (True, {}), dict)
    )
    lookups = FastLookups(routes, readers=lambda: readers, locator=lambda: locator)
    passed_on: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            passed_on.append(scope["path"])
        await lookups(scope, receive, send)

    try:
        with (
            uvicorn_thread(app) as plain,
            uvicorn_thread(app, http=lookup_protocol(lookups)) as fast,
        ):
            yield plain, fast, passed_on
    finally:
        readers.close()


def _get(path: str, extra: str = "", version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()


def _key(partition: int) -> str:
    return next(f"k-{n}" for n in range(3) if partition_for(f"k-{n}".encode(), 2) == partition)


def test_found_keys_and_redirects_are_answered_in_the_protocol(
    servers: tuple[str, str, list[str]],
) -> None:
    plain, fast, passed_on = servers
    here, elsewhere = f"/stores/kv/keys/{_key(0)}", f"/stores/kv/keys/{_key(1)}"
    requests = [_get(here), _get(here + "?hops=1"), _get(elsewhere), _get(elsewhere + "?hops=2")]
    for request in requests:
        expected = _exchange(plain, request)
        passed_on.clear()
        assert _exchange(fast, request) == expected, request
        assert passed_on == [], request
    status, headers, _ = _exchange(fast, _get(elsewhere))[0]
    assert status == b"HTTP/1.1 307 Temporary Redirect"
    assert headers[b"location"] == f"{OwnsPartitionZero.elsewhere}{elsewhere}?hops=1".encode()
    # Kept alive: several lookups, and a pipelined pair, on one connection.
    assert _exchange(fast, _get(here) * 3, 3) == _exchange(plain, _get(here) * 3, 3)
    assert _exchange(fast, _get(here) + _get(elsewhere), 2) == _exchange(
        plain, _get(here) + _get(elsewhere), 2
    )


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def test_batch_lookups_are_answered_in_the_protocol(servers: tuple[str, str, list[str]]) -> None:
    plain, fast, passed_on = servers
    keys = json.dumps(["k-0", "k-1", "k-2", "zz", "k-0"]).encode()
    requests = [_post("/stores/kv/keys", keys), _post("/stores/kv/keys?hops=1", b"[]")]  # 400
    for request in requests:
        expected = _exchange(plain, request)
        passed_on.clear()
        assert _exchange(fast, request) == expected, request
        assert passed_on == [], request
    status, headers, body = _exchange(fast, requests[0])[0]
    assert status == b"HTTP/1.1 200 OK"
    assert headers[b"content-type"] == b"application/json"
    answer = json.loads(body)
    assert answer["missing"] == ["zz"], answer
    assert set(answer["values"]) | {k for ks in answer["elsewhere"].values() for k in ks} == {
        "k-0",
        "k-1",
        "k-2",
    }
    # A body sent in pieces, and batches kept alive and pipelined with lookups on one connection.
    mixed = requests[0] + _get(f"/stores/kv/keys/{_key(0)}") + requests[0]
    expected = [_exchange(plain, requests[0]), _exchange(plain, mixed, 3)]
    passed_on.clear()
    split = requests[0][:-3], requests[0][-3:]
    assert [_exchange_in_pieces(fast, split), _exchange(fast, mixed, 3)] == expected
    assert passed_on == []


def _exchange_in_pieces(url: str, pieces: tuple[bytes, ...]) -> list[Response]:
    address = urllib.parse.urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        for piece in pieces:
            connection.sendall(piece)
            time.sleep(0.05)  # so the server reads the pieces apart
        return [_read_response(connection.makefile("rb"), False)]


def _too_deep() -> bytes:
    return b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("request_bytes", "answered_here"),
    [
        (_get("/stores/kv/keys/missing"), True),  # 404
        (_get("/stores/kv/keys/k-%30"), True),  # percent-encoded: k-0
        (_get("/stores/kv/keys/k-%FF"), True),  # not UTF-8: 400
        (_get("/stores/kv/keys/k-%FE"), True),
        (_get("/stores/%FF/keys/k-0"), True),
        (_get("/stores/kv/keys/" + "k" * 5000), True),  # key too long: 400
        (_get(f"/stores/kv/keys/{_key(0)}?max_lag=5"), True),
        (_get(f"/stores/kv/keys/{_key(0)}?max_lag=any"), True),
        (_get(f"/stores/kv/keys/{_key(0)}?max_lag=ANY"), True),  # 400
        (_get(f"/stores/kv/keys/{_key(0)}?max_lag=" + "9" * 5000), True),  # 400
        (_get(f"/stores/kv/keys/{_key(0)}?hops=" + "9" * 5000), True),  # 400
        (_get(f"/stores/kv/keys/{_key(1)}?hops=3"), True),  # too many hops: 503
        (_get(f"/stores/kv/keys/{_key(1)}?max_lag=0&hops=1"), True),  # 307 keeping max_lag
        (_get(f"/stores/kv/keys/{_key(1)}?x=%FF&hops=1"), True),  # unknown parameter: 400
        (_get(f"/stores/kv/keys/{_key(0)}?after=f1-0-1-0a0b0c0d"), True),  # not a lookup's: 400
        (_get(f"/stores/kv/keys/{_key(0)}?max_lags=1&hops=1&" + "y" * 100), True),
        (_get(f"/stores/kv/keys/{_key(0)}", version="1.0"), False),  # not kept alive
        (_get(f"/stores/kv/keys/{_key(0)}", "Connection: close\r\n"), False),
        (_get(f"/stores/kv/keys/{_key(0)}", "Expect: 100-continue\r\n"), False),
        (f"HEAD /stores/kv/keys/{_key(0)} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), False),
        (_get("/stores/a%2Fb/keys/k-0"), False),  # another path once decoded: 404
        (_get("/stores/kv/nothing"), False),
        (_post("/stores/kv/keys", b'["k-0"'), True),  # malformed: 400
        (_post("/stores/kv/keys", b'["k-0", 1]'), True),  # not all strings: 400
        (_post("/stores/kv/keys", _too_deep()), True),  # nested 100k deep: 400
        (_post("/stores/kv/keys", b'["' + b"k" * 5000 + b'"]'), True),  # key too long: 400
        (_post("/stores/nope/keys", b'["k-0"]'), True),  # no such store: 404
        (_post("/stores/kv/keys", b"[" + b'"k-0",' * 50_000 + b'"k-1"]'), False),  # too long
        (_post("/stores/kv/keys", b" " * (1024 * 1024 + 1)), False),  # over the limit: 413
        (_post("/stores/k%76/keys", b'["k-0"]'), True),  # percent-encoded
        (_post("/stores/%FF/keys", b'["k-0"]'), True),  # 400
        (_post("/stores/kv/keys?max_lag=0", b'["k-0"]'), True),  # a batch takes no max_lag: 400
        (_post("/stores/kv/keys?hops=1", b'["k-0"]'), True),  # nor hops: never redirected
        (_post("/stores/kv/keys", b'["k-0"]', "Expect: 100-continue\r\n"), False),
        (
            b"POST /stores/kv/keys HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'7\r\n["k-0"]\r\n0\r\n\r\n',
            False,
        ),
        (_get("/health"), False),
    ],
    ids=lambda r: r[:60].split(b"\r\n")[0].decode() if isinstance(r, bytes) else str(r),
)
def test_both_protocols_give_the_same_answers(
    servers: tuple[str, str, list[str]], request_bytes: bytes, answered_here: bool
) -> None:
    """Whether answered in the protocol or passed on to the app, every request gets the answer
    uvicorn's own protocol gives, and never a 500."""
    plain, fast, passed_on = servers
    expected = _exchange(plain, request_bytes)
    assert not expected[0][0].startswith(b"HTTP/1.1 5") or b"503" in expected[0][0], expected
    passed_on.clear()
    assert _exchange(fast, request_bytes) == expected
    assert len(passed_on) == (0 if answered_here else 1)


def test_a_failing_fast_path_leaves_the_request_to_the_app(tmp_path: Path) -> None:
    readers = write_store(tmp_path, {"k-0": b"1"})

    def broken() -> Any:
        raise ValueError("broken locator")

    routes = Starlette(routes=query_routes(lambda: readers, broken, lambda: (True, {}), dict))
    app = FastLookups(routes, readers=lambda: readers, locator=broken)
    try:
        with uvicorn_thread(app, http=lookup_protocol(app)) as fast:
            status, _, body = _exchange(fast, _get("/stores/kv/keys/k-0"))[0]
            assert status == b"HTTP/1.1 500 Internal Server Error", body
            status, _, body = _exchange(fast, _post("/stores/kv/keys", b'["k-0"]'))[0]
            assert status == b"HTTP/1.1 500 Internal Server Error", body
            assert _exchange(fast, _get("/health"))[0][0] == b"HTTP/1.1 200 OK"
    finally:
        readers.close()


def _lookup_app(tmp_path: Path) -> tuple[FastLookups, Any]:
    readers = write_store(tmp_path, {"k-0": b'{"n":0}', "k-1": b'{"n":1}'})
    locator = OwnsPartitionZero()
    routes = Starlette(
        routes=query_routes(lambda: readers, lambda: locator, lambda: (True, {}), dict)
    )
    return FastLookups(routes, readers=lambda: readers, locator=lambda: locator), readers


@pytest.mark.parametrize("fast", [False, True], ids=["uvicorn", "lookup-protocol"])
def test_a_batch_still_being_read_at_shutdown_is_answered_then_the_connection_closes(
    tmp_path: Path, fast: bool
) -> None:
    lookups, readers = _lookup_app(tmp_path)
    options = {"http": lookup_protocol(lookups)} if fast else {}
    server = uvicorn.Server(uvicorn.Config(lookups, log_level="warning", lifespan="off", **options))
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        request = _post("/stores/kv/keys", b'["k-0","k-1"]')
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as connection,
            connection.makefile("rb") as reader,
        ):
            connection.sendall(_get("/health"))  # the server holds the connection now
            assert _read_response(reader, False)[0] == b"HTTP/1.1 200 OK"
            connection.sendall(request[:-4])
            server.should_exit = True
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until it stopped listening: shutting down
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    break
            connection.sendall(request[-4:])
            status, headers, body = _read_response(reader, False)
            assert status == b"HTTP/1.1 200 OK", body
            assert headers[b"connection"] == b"close"
            answer = json.loads(body)
            answered = {k for keys in answer["elsewhere"].values() for k in keys}
            assert answered | set(answer["values"]) == {"k-0", "k-1"}, answer
            assert reader.read() == b""  # then closed
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        readers.close()


def test_a_request_pipelined_after_one_answered_here_is_not_cut_by_the_keep_alive_timeout(
    tmp_path: Path,
) -> None:
    """An answer given inside the parser arms uvicorn's keep-alive timer; the request after it
    in the same read must stop it, or the timer closes the connection under that request."""
    lookups, readers = _lookup_app(tmp_path)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/slow":
            await asyncio.sleep(1.5)  # longer than the keep-alive timeout below
            headers = [(b"content-length", b"4")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"slow"})
            return
        await lookups(scope, receive, send)

    try:
        with uvicorn_thread(app, http=lookup_protocol(lookups), timeout_keep_alive=1) as fast:
            for first in (_post("/stores/kv/keys", b'["k-0"]'), _get(f"/stores/kv/keys/{_key(0)}")):
                answers = _exchange(fast, first + _get("/slow"), 2)
                assert [status for status, _, _ in answers] == [b"HTTP/1.1 200 OK"] * 2, first
                assert answers[1][2] == b"slow"
    finally:
        readers.close()


def test_a_url_over_the_limit_is_414_before_the_rest_is_read(
    servers: tuple[str, str, list[str]],
) -> None:
    """uvicorn's own protocol buffers a URL of any length; the lookup protocol stops at the
    limit, answers 414 and closes the connection, whatever the path."""
    plain, fast, passed_on = servers
    long_lookup = _get("/stores/kv/keys/" + "k" * 20_000)
    for request in (long_lookup, _get("/health?" + "x" * 20_000)):
        passed_on.clear()
        status, headers, body = _exchange(fast, request)[0]
        assert status == b"HTTP/1.1 414 Request-URI Too Long", body
        assert headers[b"connection"] == b"close"
        assert "longer than 8192 bytes" in json.loads(body)["error"]
        assert passed_on == []
    # Through uvicorn's protocol the app refuses the same lookup, after reading it all.
    assert _exchange(plain, long_lookup)[0][0] == b"HTTP/1.1 414 Request-URI Too Long"
