"""The hot path of the query side: a plain ``GET /stores/{store}/keys/{key}`` (no query
string but the ``hops`` of a redirect) answered before Starlette's middleware and routing, when
this instance's active copy holds the key (200) or another member owns the key's partition (307
to it).

Those layers cost about a third of a lookup's CPU (measured on uvicorn: a bare ASGI lookup
served ~1.5x the lookups per CPU-second of the same lookup as a Starlette route). Every other
request, and every other lookup (query parameters, standby reads, 404s, 503s), goes on to the
Starlette app, which answers it the same way. On uvicorn the same answers are given earlier
still, inside the HTTP protocol (:mod:`foldstream.query_api.lookup_protocol`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from foldstream.errors import StoreNotFound
from foldstream.query_api.batch import BadBatch, batch_answer
from foldstream.query_api.http import found_body, served_by_json
from foldstream.query_api.stores import StoreReaders
from foldstream.routing import MAX_HOPS, Local, Locator, Redirect, redirect_target

_PREFIX = "/stores/"
_KEYS = "/keys/"
_BATCH = "/keys"
_JSON = (b"content-type", b"application/json")
_NO_STORE = (b"cache-control", b"no-store")
# The query string of a redirected lookup: one small hop count, nothing else.
_HOPS_QUERY = re.compile(rb"hops=([0-9]{1,2})")

Scope = dict[str, Any]
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
ASGIApp = Callable[..., Any]


class FastLookups:
    """ASGI middleware answering found keys of active partitions; ``readers()`` and
    ``locator()`` return the instance's (None, or raising RuntimeError, until it started)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        readers: Callable[[], StoreReaders | None],
        locator: Callable[[], Locator | None],
    ) -> None:
        self.app = app
        self.readers = readers
        self.locator = locator

    async def __call__(self, scope: Scope, receive: ASGIApp, send: ASGIApp) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            answer = self.answer(scope["path"], scope.get("raw_path"), scope["query_string"])
            if answer is not None:
                status, headers, body = answer
                headers.append((b"content-length", str(len(body)).encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def answer(self, path: str, raw_path: bytes | None, query_string: bytes) -> Answer | None:
        """Status, headers (no ``content-length``) and body of a ``GET`` of ``path`` that is a
        found key of an active partition or a redirect; None for any other request."""
        if not path.startswith(_PREFIX) or (hops := _hops(query_string)) is None:
            return None
        store, keys, key = path[len(_PREFIX) :].partition(_KEYS)
        if not keys or not key or "/" in store:
            return None
        try:
            stores, locator = self.readers(), self.locator()
            if stores is None or locator is None:
                return None
            info = stores.info(store)
        except (RuntimeError, StoreNotFound):
            return None
        raw_key = key.encode()
        partition = stores.partition(store, raw_key)
        location = locator.locate(info.topic, partition)
        if isinstance(location, Redirect):
            if hops >= MAX_HOPS:
                return None  # the app answers 503: the members disagree on the owner
            target = redirect_target(location.url, raw_path or path.encode(), [], hops + 1)
            return 307, [(b"location", target.encode("latin-1")), _NO_STORE], b""
        if not isinstance(location, Local) or location.role != "active":
            return None
        value = stores.get(store, partition, raw_key)
        if value is None:
            return None
        return 200, [_JSON], found_body(key, value, served_by_json(location, partition))

    def answer_batch(self, path: str, body: bytes) -> Answer | None:
        """Status, headers (no ``content-length``) and body of a 200 answering a batch lookup
        (``POST`` of ``body`` to ``path``); None if ``path`` is no store's batch path or the
        app should answer (an error)."""
        if not path.startswith(_PREFIX) or not path.endswith(_BATCH):
            return None
        store = path[len(_PREFIX) : -len(_BATCH)]
        if not store or "/" in store:
            return None
        try:
            stores, locator = self.readers(), self.locator()
            if stores is None or locator is None:
                return None
            return 200, [_JSON], batch_answer(stores, locator, store, body)
        except (RuntimeError, StoreNotFound, BadBatch):
            return None


def _hops(query_string: bytes) -> int | None:
    """The hop count of a plain or redirected lookup's query string; None for any other."""
    if not query_string:
        return 0
    matched = _HOPS_QUERY.fullmatch(query_string)
    return int(matched.group(1)) if matched else None
