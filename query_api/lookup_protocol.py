"""The lookup fast path inside uvicorn's HTTP protocol: a plain ``GET`` by key answered as soon as
its headers are parsed, without an ASGI request cycle.

For each request uvicorn builds a request-response cycle (an ``asyncio.Event`` among others),
starts a task to run the app, checks every response header and writes the head and the body
in two writes. Next to a lookup that costs little (a RocksDB get), that was a third of its CPU
and most of a redirect's. Answered here, the same bytes go out in one write, from the parser
callback. Measured with wrk on foldstream's query routes over 100k keys: 97–102 µs of server CPU
per lookup through uvicorn's cycle, 68–76 µs here (16 connections); 131–148 µs against 74–84 µs
with 2 connections, where every request wakes the server on its own.

Only the requests :meth:`FastLookups.answer` answers take this path, and only on a kept-alive
HTTP/1.1 connection with no request in progress on it; everything else (and anything the fast
path fails on) goes to the app through uvicorn's own handling. The class extends uvicorn's
``HttpToolsProtocol``, whose internals it relies on: uvicorn is pinned, and
``tests/test_lookup_protocol.py`` compares both paths byte for byte over real sockets.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from foldstream.query_api.fast_lookup import FastLookups

log = logging.getLogger(__name__)


class _NoEvent:
    def set(self) -> None:
        pass


class _Answered:
    """The cycle of a request answered here: complete, so the parser's later callbacks for the
    same request (body, message complete) and a shutdown treat it as done."""

    response_complete = True
    message_event = _NoEvent()


_ANSWERED = _Answered()


class LookupProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering what :attr:`lookups` answers itself."""

    lookups: ClassVar[FastLookups]

    def on_headers_complete(self) -> None:
        response = self._fast_response()
        if response is None:
            super().on_headers_complete()
            return
        self.transport.write(response)
        self.cycle = _ANSWERED  # type: ignore[assignment]
        self.on_response_complete()

    def _fast_response(self) -> bytes | None:
        parser = self.parser
        if (
            parser.get_method() != b"GET"
            or parser.get_http_version() != "1.1"
            or not parser.should_keep_alive()
            or parser.should_upgrade()
            or self.expect_100_continue
            or self.root_path
            or self.limit_concurrency is not None
            or self.flow.write_paused
            or self.pipeline
            or (self.cycle is not None and not self.cycle.response_complete)
        ):
            return None
        url = httptools.parse_url(self.url)
        raw_path = url.path
        if b"%" in raw_path:
            return None  # percent-decoding is left to uvicorn
        try:
            answer = self.lookups.answer(raw_path.decode("ascii"), raw_path, url.query or b"")
        except Exception:
            # The app answers the same request next, and reports what failed (a 500).
            log.debug("lookup fast path failed; left to the app", exc_info=True)
            return None
        if answer is None:
            return None
        status, headers, body = answer
        if self.access_log:
            self.access_logger.info(
                '%s - "GET %s HTTP/1.1" %d', _client(self.client), self.url.decode(), status
            )
        head = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *headers):
            head += (name, b": ", value, b"\r\n")
        head += (b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body)
        return b"".join(head)


def lookup_protocol(lookups: FastLookups) -> type[LookupProtocol]:
    """A :class:`LookupProtocol` class answering with ``lookups`` (uvicorn's ``http=``)."""
    return type("LookupProtocol", (LookupProtocol,), {"lookups": lookups})


def _client(client: Any) -> str:
    return f"{client[0]}:{client[1]}" if client else "-"
