"""The lookup fast path inside uvicorn's HTTP protocol: a plain ``GET`` by key answered as soon as
its headers are parsed, and a batch lookup (``POST /stores/{store}/keys``) as soon as its body
is, without an ASGI request cycle.

For each request uvicorn builds a request-response cycle (an ``asyncio.Event`` among others),
starts a task to run the app, checks every response header and writes the head and the body
in two writes. Next to a lookup that costs little (a RocksDB get), that was a third of its CPU
and most of a redirect's. Answered here, the same bytes go out in one write, from the parser
callback, for about two thirds of the CPU, and batch lookups save the same per request
(docs/decisions.md, "Lookup fast paths").

Only the requests :meth:`FastLookups.answer` and :meth:`FastLookups.answer_batch` answer take
this path (a batch only with a ``content-length`` of at most :data:`MAX_BATCH_BODY` and the
body limit), and only on a kept-alive HTTP/1.1 connection with no request in progress on it,
while the fast path is on; everything else (and anything the fast path fails on) goes to the
app through uvicorn's own handling. The answers are built where the routes build theirs
(:mod:`foldstream.query_api.answers`), with the same limits.

The protocol also bounds the URL of every request (uvicorn's httptools protocol buffers any
length): one longer than the limit is answered 414 and its connection closed, before the rest
of the request is read.

The class extends uvicorn's ``HttpToolsProtocol``, whose internals it relies on: uvicorn is
pinned, and ``tests/test_lookup_protocol.py`` compares both paths byte for byte over real
sockets.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from foldstream.query_api.consistency import header_value
from foldstream.query_api.fast_lookup import FastLookups
from foldstream.responses import Answer, error_answer

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
#: The largest batch lookup body read here; a larger one goes to the app, which reads it under
#: uvicorn's flow control.
MAX_BATCH_BODY = 256 * 1024


class LookupProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering what :attr:`lookups` answers itself."""

    lookups: ClassVar[FastLookups]
    #: The body of a batch lookup being read here (None: no such request in progress), and
    #: its raw path and query string.
    _batch: list[bytes] | None = None
    _batch_path = b""
    _batch_query = b""
    #: A graceful shutdown came while a batch was read: answer it, then close (as uvicorn
    #: does for a request in progress).
    _close_after_batch = False
    #: The answer to a request refused while its head was read (its URL too long): sent in
    #: place of uvicorn's 400 for a request it could not parse.
    _refused: Answer | None = None

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        limit = self.lookups.answers.limits.max_url_bytes
        if len(self.url) > limit:
            self._refused = error_answer(414, f"the URL is longer than {limit} bytes")
            raise ValueError("URL too long")  # stops the parser: uvicorn answers 400, see below

    def send_400_response(self, msg: str) -> None:
        refused, self._refused = self._refused, None
        if refused is None:
            super().send_400_response(msg)
            return
        status, headers, body = refused
        head = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *headers):
            head += (name, b": ", value, b"\r\n")
        head += (b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body), body)
        self.transport.write(b"".join(head))
        self.transport.close()

    def on_message_begin(self) -> None:
        # A request answered here armed the keep-alive timer from inside the parser: the next
        # request, already in the same read (pipelined), must stop it as a new read would.
        self._unset_keepalive_if_required()
        super().on_message_begin()

    def shutdown(self) -> None:
        if self._batch is None:
            super().shutdown()
        else:
            self._close_after_batch = True

    def on_headers_complete(self) -> None:
        if self._fast_path_open():
            method = self.parser.get_method()
            if method == b"GET":
                answer = self._lookup_answer()
                if answer is not None:
                    self._answer("GET", answer)
                    return
            elif method == b"POST" and (target := self._batch_lookup_target()) is not None:
                # Read here; answered once complete.
                self._batch, (self._batch_path, self._batch_query) = [], target
                return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._batch is None:
            super().on_body(body)
        else:
            self._batch.append(body)

    def on_message_complete(self) -> None:
        if self._batch is None:
            super().on_message_complete()
            return
        body, self._batch = b"".join(self._batch), None
        try:
            answer = self.lookups.answer_batch(self._batch_path, self._batch_query, body)
        except Exception:
            log.debug("batch fast path failed; left to the app", exc_info=True)
            answer = None
        if answer is None:
            # The app answers (an error, or what failed here) as if uvicorn had read the body.
            super().on_headers_complete()
            if self._close_after_batch:
                self.cycle.keep_alive = False
            self.cycle.body += body
            self.cycle.more_body = False
            self.cycle.message_event.set()
            return
        self._answer("POST", answer)

    def _answer(self, method: str, answer: Answer) -> None:
        """Write the whole response in one write, and finish the request as uvicorn does."""
        status, headers, body = answer
        headers = [*headers, (b"content-length", b"%d" % len(body))]
        if self._close_after_batch:
            headers.append((b"connection", b"close"))
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/1.1" %d', _client(self.client), method, self.url.decode(), status
            )
        head = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *headers):
            head += (name, b": ", value, b"\r\n")
        head += (b"\r\n", body)
        self.transport.write(b"".join(head))
        self.cycle = _ANSWERED  # type: ignore[assignment]
        if self._close_after_batch:
            self.transport.close()
        self.on_response_complete()

    def _fast_path_open(self) -> bool:
        """Whether the request may be answered here: a kept-alive HTTP/1.1 request, alone on
        its connection, under none of the options the fast path does not implement."""
        parser = self.parser
        return not (
            not self.lookups.enabled
            or parser.get_http_version() != "1.1"
            or not parser.should_keep_alive()
            or parser.should_upgrade()
            or self.expect_100_continue
            or self.root_path
            or self.limit_concurrency is not None
            or self.flow.write_paused
            or self.pipeline
            or (self.cycle is not None and not self.cycle.response_complete)
            or header_value(self.headers) is not None  # a consistency token: the app waits
        )

    def _batch_lookup_target(self) -> tuple[bytes, bytes] | None:
        """The raw path and query string of a batch lookup whose body is read here: one of
        known, small length (larger ones are read, and refused beyond the limit, by the app)."""
        length = None
        for name, value in self.headers:
            if name == b"transfer-encoding":
                return None
            if name == b"content-length":
                length = value
        limit = min(MAX_BATCH_BODY, self.lookups.answers.limits.max_body_bytes)
        if length is None or not length.isdigit() or len(length) > 9 or int(length) > limit:
            return None
        url = httptools.parse_url(self.url)
        raw_path: bytes = url.path
        return (raw_path, url.query or b"") if raw_path.endswith(b"/keys") else None

    def _lookup_answer(self) -> Answer | None:
        url = httptools.parse_url(self.url)
        return self.lookups.answer(url.path, url.query or b"")


def lookup_protocol(lookups: FastLookups) -> type[LookupProtocol]:
    """A :class:`LookupProtocol` class answering with ``lookups`` (uvicorn's ``http=``)."""
    return type("LookupProtocol", (LookupProtocol,), {"lookups": lookups})


def _client(client: Any) -> str:
    return f"{client[0]}:{client[1]}" if client else "-"
