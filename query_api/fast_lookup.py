"""The hot path of the query side: ``GET /stores/{store}/keys/{key}`` answered before
Starlette's middleware and routing.

Those layers cost about a third of a lookup's CPU (docs/decisions.md, "Lookup fast paths").
The answer is
:class:`~foldstream.query_api.answers.LookupAnswers`' (the route's own): every status, the
same bytes. Every other request goes on to the app, and so does every request while the fast
path is off (``enabled=False``: the instance requires credentials for queries, which the app's
middleware checks). On uvicorn the same answers are given earlier still, inside the HTTP
protocol (:mod:`foldstream.query_api.lookup_protocol`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from foldstream.http_input import InputLimits
from foldstream.query_api.answers import LookupAnswers, raw_path_of
from foldstream.query_api.consistency import has_token, token_header
from foldstream.query_api.stores import StoreReaders
from foldstream.responses import Answer
from foldstream.routing import Locator

log = logging.getLogger(__name__)
Scope = dict[str, Any]
ASGIApp = Callable[..., Any]


class FastLookups:
    """ASGI middleware answering lookups; ``readers()`` and ``locator()`` return the
    instance's (None, or raising RuntimeError, until it started: the app answers meanwhile)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        readers: Callable[[], StoreReaders | None],
        locator: Callable[[], Locator | None],
        limits: InputLimits | None = None,
        enabled: bool = True,
    ) -> None:
        self.app = app
        self.answers = LookupAnswers(readers, locator, limits)
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: ASGIApp, send: ASGIApp) -> None:
        if (
            self.enabled
            and scope["type"] == "http"
            and scope["method"] == "GET"
            and token_header(scope) is None  # a consistency token: the app waits for it
        ):
            answer = self.answer(raw_path_of(scope), scope["query_string"])
            if answer is not None:
                status, headers, body = answer
                headers = [*headers, (b"content-length", b"%d" % len(body))]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def answer(self, raw_path: bytes, query_string: bytes) -> Answer | None:
        """The answer to a ``GET`` of ``raw_path``; None if it is no lookup, the fast path is
        off, or the instance cannot answer it yet (the app answers those)."""
        if not self.enabled or has_token(query_string):  # the app waits for a token
            return None
        try:
            return self.answers.lookup(raw_path, query_string)
        except Exception:  # not started, or failed: the app answers (and reports what failed)
            log.debug("lookup fast path failed; left to the app", exc_info=True)
            return None

    def answer_batch(self, raw_path: bytes, query_string: bytes, body: bytes) -> Answer | None:
        """The answer to a batch lookup (``POST`` of ``body`` to ``raw_path``); None if it is
        no batch lookup, the fast path is off or the instance cannot answer it yet."""
        if not self.enabled or has_token(query_string):
            return None
        try:
            return self.answers.batch(raw_path, query_string, body)
        except Exception:
            log.debug("batch fast path failed; left to the app", exc_info=True)
            return None
