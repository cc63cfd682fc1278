"""``POST /stores/{store}/keys``: many keys per request, values exactly as stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from foldstream.direct_routes import DirectRoutes
from foldstream.http_input import InputLimits
from foldstream.kafka import partition_for
from foldstream.query_api import StoreReaders, query_routes
from foldstream.query_api.stores import StoreInfo
from foldstream.routing import LocalOnly
from foldstream.state import RocksDBWriter, partition_path


def write_store(state_dir: Path, stored: dict[str, bytes]) -> StoreReaders:
    """Store ``kv`` (2 partitions of topic ``t``, murmur2) holding ``stored``, and its readers."""
    for key, value in stored.items():
        partition = partition_for(key.encode(), 2)
        writer = RocksDBWriter(
            partition_path(state_dir, "kv", partition), identity=f"t/{partition}"
        )
        writer.put(key.encode(), value)
        writer.commit(0)
        writer.close()
    return StoreReaders.at(state_dir, {"kv": StoreInfo("t", 2, "murmur2")})


def call(
    app: Callable[..., Any],
    method: str,
    path: str,
    body: bytes,
    query: bytes = b"",
    *,
    raw: bool = False,
) -> Any:
    """One request through the ASGI app, without a server: ``(status, JSON body)``, or with
    ``raw`` ``(status, headers, body bytes)``."""
    sent: list[dict[str, Any]] = []
    request = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return request.pop(0) if request else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"content-type", b"application/json")],
    }
    asyncio.run(app(scope, receive, send))
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    if raw:
        return sent[0]["status"], dict(sent[0]["headers"]), payload
    return sent[0]["status"], json.loads(payload)


@pytest.mark.parametrize("direct", [False, True], ids=["through-starlette", "direct-route"])
def test_batch_returns_stored_values_and_missing_keys(tmp_path: Path, direct: bool) -> None:
    """The same answers through Starlette's middleware and router and straight to the route."""
    stored = {"a": b'{"n":1}', "b\u00e9": b'"text"', "c": b"[1,2]"}
    readers = write_store(tmp_path, stored)
    owned = {0, 1}
    routes = Starlette(
        routes=query_routes(
            lambda: readers, lambda: LocalOnly(lambda: owned), lambda: (True, {}), dict
        )
    )
    app: Callable[..., Any] = DirectRoutes(routes, {"/stores/{store}/keys"}) if direct else routes
    try:
        status, body = call(
            app, "POST", "/stores/kv/keys", json.dumps(["a", "b\u00e9", "zz", "c"]).encode()
        )
        assert status == 200
        assert body == {
            "values": {"a": {"n": 1}, "b\u00e9": "text", "c": [1, 2]},
            "missing": ["zz"],
            "elsewhere": {},
            "unavailable": [],
        }
        # Keys of partitions this instance does not serve are never answered from its copy.
        owned.discard(partition_for(b"a", 2))
        status, body = call(app, "POST", "/stores/kv/keys", b'["a"]')
        assert status == 200 and body["values"] == {} and body["unavailable"] == ["a"]
        owned.add(partition_for(b"a", 2))
        assert call(app, "POST", "/stores/nope/keys", b'["a"]')[0] == 404
        # Keys written plainly, and the same keys escaped in the request's JSON.
        for request in (b'["a","c","a"]', b'["\\u0061","c","a"]'):
            status, body = call(app, "POST", "/stores/kv/keys", request)
            assert status == 200 and body["values"] == {"a": {"n": 1}, "c": [1, 2]}, request
        for bad in (
            b"{",
            b'{"a": 1}',
            b"[1]",
            b"[[1]]",
            b'["a", null]',
            b'["\\ud800"]',
            b"[" * 5000,
        ):
            status, body = call(app, "POST", "/stores/kv/keys", bad)
            assert status == 400 and body["error"], bad
        max_keys = InputLimits().max_batch_keys
        too_many = json.dumps([f"k{n}" for n in range(max_keys + 1)]).encode()
        status, body = call(app, "POST", "/stores/kv/keys", too_many)
        assert status == 400 and str(max_keys) in body["error"]
    finally:
        readers.close()


def test_keys_needing_escapes_come_back_as_sent(tmp_path: Path) -> None:
    """Keys with quotes, backslashes, control and non-ASCII characters are answered under the
    same keys, whether the request escaped them or (non-ASCII) sent them as UTF-8."""
    keys = ['q"uote', "back\\slash", "tab\t", "caf\u00e9", "\U0001f600", "del\x7f", "plain"]
    keys += ["\u4141\u0100"]  # in UTF-16: bytes that all look like ASCII
    readers = write_store(tmp_path, {key: json.dumps(n).encode() for n, key in enumerate(keys)})
    app = Starlette(
        routes=query_routes(
            lambda: readers, lambda: LocalOnly(lambda: {0, 1}), lambda: (True, {}), dict
        )
    )
    expected = {key: n for n, key in enumerate(keys)}
    try:
        few = ["\u4141\u0100", "plain"]
        requests = [
            (json.dumps(keys).encode(), keys),
            (json.dumps(keys, ensure_ascii=False).encode(), keys),
            # JSON may come in UTF-16 or -32 too: bytes that may all look like ASCII.
            (json.dumps(keys, ensure_ascii=False).encode("utf-16-le"), keys),
            (json.dumps(few, ensure_ascii=False).encode("utf-16-le"), few),
        ]
        for request, wanted in requests:
            status, _, payload = call(app, "POST", "/stores/kv/keys", request, raw=True)
            assert status == 200 and payload.isascii(), payload  # keys escaped as ever
            assert json.loads(payload)["values"] == {k: expected[k] for k in wanted}, request
        # JSON allows DEL unescaped: a request without escapes may carry it as it is.
        status, body = call(app, "POST", "/stores/kv/keys", b'["del\x7f", "plain"]')
        assert status == 200 and body["values"] == {"del\x7f": 5, "plain": 6}
    finally:
        readers.close()


def test_direct_routes_name_existing_routes_only() -> None:
    with pytest.raises(ValueError, match="/nope"):
        DirectRoutes(Starlette(routes=[]), {"/nope"})


def test_batch_keys_longer_than_the_limit_are_refused_however_spelled() -> None:
    """A plain body no longer than the key limit skips the per-key length check (no key can be
    longer than it): every other body still has each key measured in UTF-8 bytes."""
    from foldstream.query_api.batch import BadBatch, _is_plain, _keys

    limits = InputLimits(max_key_bytes=4)
    too_long = [
        b'["abcde"]',  # plain, longer than the limit
        b'["ab","cdefg"]',
        json.dumps(["abc\u00e9"]).encode(),  # escaped: 5 bytes in UTF-8
        json.dumps(["abc\u00e9"], ensure_ascii=False).encode(),
        json.dumps(["\u4141\u0100"], ensure_ascii=False).encode("utf-16-le"),
    ]
    for body in too_long:
        with pytest.raises(BadBatch, match="at most 4"):
            _keys(body, limits, _is_plain(body))
    assert _is_plain(b'["ab"]') and not _is_plain(b'["a\\"b"]')
    assert _keys(b'["ab"]', limits, True) == [b"ab"]  # body within the limit: no key over it
    assert _keys(b'["abcd","abcd"]', limits, True) == [b"abcd"]
