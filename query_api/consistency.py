"""Read-your-writes: queries answered only with state that includes a consistency token.

A command's answer carries a token, the position of its last event (:mod:`foldstream.tokens`).
A lookup, a batch lookup, or a range or windows read that sends it back
(``?consistent_with=TOKEN`` or the header ``Foldstream-Consistent-With``; ``after`` is the
range reads' page cursor) is answered from a copy that has applied that position: the copy the
lookup would read anyway (the active one, or a standby within ``max_lag``) is awaited up to the
instance's ``consistency_wait_ms``, woken as soon as its writer applies the offset
(:class:`~foldstream.state.applied.AppliedOffsets`); if it has not by then, the answer is 503
with ``Retry-After`` (a batch lists the keys of that partition as ``unavailable``). A copy of
another partition than the token's needs no wait: a partition of a store folds only the events
of its own source partition.

A token is a position of one topic: one sent to a store of another source topic is a 400, like
one that does not parse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from foldstream.errors import InvalidRequest
from foldstream.http_input import has_bytes, last, query_params
from foldstream.query_api.stores import StoreReaders
from foldstream.responses import NO_STORE, Answer, error_answer
from foldstream.tokens import HEADER, PARAM, Token, parse_token

#: Seconds a client waits before asking again when a copy has not applied its token yet.
RETRY_AFTER_S = 1
_PARAM_BYTES = PARAM.encode() + b"="


def has_token(query_string: bytes) -> bool:
    """Whether a query string may carry a token (cheap: the fast paths leave those to the
    app, which can wait)."""
    return has_bytes(query_string, _PARAM_BYTES)


def token_header(scope: Mapping[str, Any]) -> bytes | None:
    """The value of an ASGI request's ``Foldstream-Consistent-With`` header (None without one)."""
    return header_value(scope.get("headers", ()))


def header_value(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The value of ``Foldstream-Consistent-With`` among ``headers`` (lower-case names), if any."""
    for name, value in headers:
        if name == HEADER:
            return value
    return None


def requested_token(query_string: bytes, header: bytes | None) -> Token | None:
    """The token of a query (its ``consistent_with`` parameter, else ``header``); None without one;
    :class:`InvalidRequest` (400) for one that does not parse."""
    raw = last(query_params(query_string), PARAM) if query_string else None
    if raw is None and header is not None:
        raw = header.decode("latin-1")
    return None if raw is None else parse_token(raw)


def check_topic(token: Token, store: str, topic: str) -> None:
    """:class:`InvalidRequest` unless ``token`` is a position of ``store``'s source ``topic``."""
    if not token.of(topic):
        raise InvalidRequest(
            f"{PARAM}: the token is no position of {topic!r}, the source topic of store "
            f"{store!r} (send a token of a command of this service, as it was answered)"
        )


async def wait_for_token(
    stores: StoreReaders,
    store: str,
    topic: str,
    partition: int,
    token: Token,
    wait_s: float,
    *,
    standby: bool,
) -> Answer | None:
    """None once this instance's copy of ``partition`` of ``store`` includes ``token`` (at
    once for another partition than the token's); else, after ``wait_s`` seconds, the 503 to
    answer. :class:`InvalidRequest` for a token of another topic."""
    check_topic(token, store, topic)
    if token.partition != partition:
        return None
    if await stores.wait_applied(store, partition, token.offset, wait_s, standby=standby):
        return None
    return not_applied(partition)


def not_applied(partition: int) -> Answer:
    """503: the copy of ``partition`` has not applied the token's position yet."""
    return error_answer(
        503,
        f"partition {partition}: the copy here has not applied the token's position yet; ask again",
        [(b"retry-after", b"%d" % RETRY_AFTER_S), NO_STORE],
        partition=partition,
    )
