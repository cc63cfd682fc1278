"""The lookup fast path answers exactly what the Starlette route answers, or leaves it to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from foldstream.kafka import partition_for
from foldstream.query_api import StoreReaders, query_routes
from foldstream.query_api.fast_lookup import FastLookups
from foldstream.query_api.stores import StoreInfo
from foldstream.routing import Local, LocalOnly, Location, MaxLag, Redirect
from tests.test_batch_lookups import call, write_store


def test_fast_path_answers_found_keys_and_passes_everything_else_on(tmp_path: Path) -> None:
    stored = {"a": b'{"n":1}', "b\u00e9/x": b'"text"', "c": b"[1,2]"}
    readers = write_store(tmp_path, stored)
    owned = {0, 1}
    locator = LocalOnly(lambda: owned)
    routes = Starlette(
        routes=query_routes(lambda: readers, lambda: locator, lambda: (True, {}), dict)
    )
    passed_on: list[str] = []

    async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            passed_on.append(scope["path"])
        await routes(scope, receive, send)

    fast = FastLookups(counted, readers=lambda: readers, locator=lambda: locator)
    try:
        for key in stored:
            path = f"/stores/kv/keys/{key}"
            for query in (b"", b"hops=1"):  # as sent by a client, and after a redirect
                assert call(fast, "GET", path, b"", query) == call(routes, "GET", path, b"", query)
        assert passed_on == [], "found keys of active partitions are answered by the fast path"

        owned.discard(partition_for(b"a", 2))
        lookups = [
            ("/stores/kv/keys/zz", b""),  # missing: 404 with served_by
            ("/stores/nope/keys/a", b""),  # unknown store
            ("/stores/kv/keys/a", b""),  # partition not owned: 503
            ("/stores/kv/keys/c", b"max_lag=x"),  # 400
            ("/stores/kv/keys/c", b"max_lag=any"),
            ("/stores/kv/keys/c", b"max_lag=ANY"),  # 400
            ("/stores/kv/keys/c", b"hops=1&max_lag=0"),
            ("/stores/kv/keys/c", b"hops=x"),  # 400
            ("/stores/kv/keys/", b""),
            ("/stores/kv/keys/%FF", b""),  # not UTF-8: 400, never U+FFFD
            ("/stores/%FE/keys/a", b""),
            ("/stores/kv/keys/" + "k" * 5000, b""),  # key too long: 400
            ("/stores/kv/keys/c", b"x=" + b"y" * 9000),  # URL too long: 414
            ("/stores/kv/keys/c", b"max_lag=" + b"9" * 5000),  # 400, not parsed
            ("/stores/kv/keys/c", b"hops=" + b"9" * 5000),
        ]
        for path, query in lookups:
            passed_on.clear()
            answer = call(fast, "GET", path, b"", query, raw=True)
            assert answer == call(routes, "GET", path, b"", query, raw=True), path
            assert answer[0] != 500, (path, answer)
            assert passed_on == [], path
        for path in ("/stores", "/health", "/stores/kv/owners/a", "/stores/a%2Fb/keys/c"):
            passed_on.clear()
            call(fast, "GET", path, b"")
            assert passed_on == [path], path
        assert call(fast, "GET", "/stores/kv/keys/a", b"")[0] == 503
        statuses = [call(fast, "GET", path, b"", query)[0] for path, query in lookups[8:]]
        assert statuses == [404, 400, 400, 400, 414, 400, 400]
    finally:
        readers.close()


class OwnsPartitionZero:
    """Partition 0 is served here, the others by the member at ``elsewhere``."""

    elsewhere = "http://127.0.0.1:9"

    def locate(self, topic: str, partition: int, *, max_lag: MaxLag = None) -> Location:
        if partition == 0:
            return Local(partition, "active", 0, "here")
        return Redirect(partition, self.elsewhere)


def test_fast_path_redirects_like_the_route(tmp_path: Path) -> None:
    readers = StoreReaders.at(tmp_path, {"kv": StoreInfo("t", 2, "murmur2")})
    locator = OwnsPartitionZero()
    routes = Starlette(
        routes=query_routes(lambda: readers, lambda: locator, lambda: (True, {}), dict)
    )
    fast = FastLookups(routes, readers=lambda: readers, locator=lambda: locator)
    key = next(k for k in (f"r-{n}" for n in range(100)) if partition_for(k.encode(), 2) == 1)
    path = f"/stores/kv/keys/{key}"
    try:
        answer = call(fast, "GET", path, b"", raw=True)
        assert answer == call(routes, "GET", path, b"", raw=True)
        status, headers, _ = answer
        assert status == 307
        assert headers[b"location"] == f"{locator.elsewhere}{path}?hops=1".encode()
        assert headers[b"cache-control"] == b"no-store"
        # A redirected lookup redirected again counts one more hop, until the route's 503.
        for hops, status in ((1, 307), (2, 307), (3, 503)):
            query = f"hops={hops}".encode()
            answer = call(fast, "GET", path, b"", query, raw=True)
            assert answer == call(routes, "GET", path, b"", query, raw=True), hops
            assert answer[0] == status, hops
    finally:
        readers.close()


def test_found_bodies_are_what_json_dumps_writes() -> None:
    """The 200 body is built from cached and pre-encoded parts: byte for byte what encoding
    each part with json.dumps writes, whatever the key holds and whatever copy answers."""
    import json

    from foldstream.query_api.answers import found_body, served_by_json

    value = b'{"on_hand": 3}'
    for key in ["sku-1", 'q"uote', "back\\slash", "\x01\x7f", "ünï", "😀", ""]:
        for location in (Local(2, "active", None, "a"), Local(2, "standby", 17, 'b"')):
            served_by = {"instance": location.instance, "role": location.role}
            served_by |= {"partition": 2, "lag": location.lag}
            expected = b'{"key":%s,"value":%s,"served_by":%s}' % (
                json.dumps(key).encode(),
                value,
                json.dumps(served_by).encode(),
            )
            assert found_body(key, value, served_by_json(location, 2)) == expected
