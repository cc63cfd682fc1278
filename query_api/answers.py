"""Every answer to a lookup, built in one place: ``GET /stores/{store}/keys/{key}`` (200, 307,
400, 404, 414, 503), ``POST /stores/{store}/keys`` (a batch: 200, 400, 404, 413, 414), and the
range and window reads of ordered stores, ``GET /stores/{store}/keys/{key}/range`` and
``.../windows`` (their parameters and bodies: :mod:`.range_answers`), routed as lookups are.
A key that ends in ``/range`` or ``/windows`` is looked up with its last ``/`` sent as ``%2F``.

The Starlette routes (:mod:`.http`), the ASGI fast path (:mod:`.fast_lookup`) and the uvicorn
protocol (:mod:`.lookup_protocol`) all hand the raw request (path as sent, query string, body)
to :class:`LookupAnswers` and send the :class:`~foldstream.responses.Answer` it returns, so
they check the same limits and send the same bytes. Names and keys are percent-decoded here,
strictly: a key that is not UTF-8 (``%FF``) is refused, never replaced by U+FFFD.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from json.encoder import encode_basestring_ascii
from typing import Any
from urllib.parse import quote

from foldstream.errors import InvalidRequest, StoreNotFound
from foldstream.http_input import InputLimits, Params, count, has_bytes, last
from foldstream.query_api.batch import batch_answer
from foldstream.query_api.consistency import check_topic, requested_token, wait_for_token
from foldstream.query_api.range_answers import RANGE, WINDOWS, entries_body, ordered_params, span_of
from foldstream.query_api.stores import StoreInfo, StoreReaders
from foldstream.responses import JSON_TYPE, NO_STORE, Answer, error_answer
from foldstream.route_params import BATCH, LOOKUP, OWNERS, RANGE_READ, WINDOWS_READ, RouteParams
from foldstream.routing import (
    HOPS_PARAM,
    Local,
    Location,
    Locator,
    MaxLag,
    Redirect,
    Unavailable,
    max_lag_param,
    redirect_answer,
    unavailable_answer,
)
from foldstream.state.ordered_keys import STREAM_TIME, decode_int, encode_int
from foldstream.tokens import Token

_STORES = b"/stores/"
_SAFE_IN_PATH = "/:@!$&'()*+,;=-._~"
_ORDERED_READS = (RANGE, WINDOWS)


def raw_path_of(scope: dict[str, Any]) -> bytes:
    """The request's path as the client sent it (percent-encoded), from an ASGI scope."""
    raw = scope.get("raw_path")
    return raw if raw else quote(scope["path"], safe=_SAFE_IN_PATH).encode("ascii")


def store_path(raw_path: bytes, kind: bytes) -> tuple[bytes, bytes] | None:
    """``(store, rest)`` of ``/stores/{store}/{kind}...`` (both still percent-encoded; ``rest``
    what follows ``kind``); None for any other path, or a store name holding ``%2F``."""
    if not raw_path.startswith(_STORES):
        return None
    store, slash, rest = raw_path[len(_STORES) :].partition(b"/")
    if not store or not slash or not rest.startswith(kind):
        return None
    if has_bytes(store, b"%") and has_bytes(store.lower(), b"%2f"):
        return None  # decoded, its path has another shape: the routes see another path
    return store, rest[len(kind) :]


class LookupAnswers:
    """Answers lookups from the stores ``readers()`` returns and the ``locator()`` (the
    instance's; either raises RuntimeError, or is None, until the instance started)."""

    def __init__(
        self,
        readers: Callable[[], StoreReaders | None],
        locator: Callable[[], Locator | None],
        limits: InputLimits | None = None,
    ) -> None:
        self.readers = readers
        self.locator = locator
        self.limits = limits or InputLimits()
        #: Store names as sent (percent-encoded) -> decoded, for the stores that exist.
        self._names: dict[bytes, str] = {}

    def _started(self) -> tuple[StoreReaders, Locator]:
        stores, locator = self.readers(), self.locator()
        if stores is None or locator is None:
            raise RuntimeError("the instance is not started")
        return stores, locator

    def lookup(self, raw_path: bytes, query_string: bytes) -> Answer | None:
        """The answer to ``GET raw_path?query_string``; None if it is no lookup's path."""
        target = store_path(raw_path, b"keys/")
        if target is None:
            return None
        try:
            return self._lookup(raw_path, query_string, *target)
        except InvalidRequest as exc:
            return error_answer(exc.status, str(exc))
        except StoreNotFound as exc:
            return error_answer(404, str(exc))

    def _lookup(
        self,
        raw_path: bytes,
        query_string: bytes,
        raw_store: bytes,
        raw_key: bytes,
        version: str | None = None,
    ) -> Answer:
        """``version``: the store's version to read (by default the one serving now)."""
        limits = self.limits
        if len(raw_path) + len(query_string) > limits.max_url_bytes:
            limits.check_url(raw_path, query_string)  # raises
        store = self._names.get(raw_store) or limits.name(raw_store, "store name")
        if raw_key.endswith(_ORDERED_READS):
            return self._ordered(raw_path, query_string, store, raw_key, version)
        if (
            raw_key.isascii()
            and not has_bytes(raw_key, b"%")
            and len(raw_key) <= limits.max_key_bytes
        ):
            key = raw_key  # as limits.key() would have it, for fewer calls on the hot path
        else:
            key = limits.key(raw_key)
        params, max_lag = routing_params(query_string, LOOKUP)
        stores, locator = self._started()
        version = version or stores.serving(store)
        info = stores.info(version)
        self._names[raw_store] = store  # a store's: the cache stays as small as the layout
        if info.kind != "point":
            return error_answer(400, _not_a(store, "point", info))
        partition = info.partition_of(key)
        location = locator.locate(info.topic, partition, max_lag=max_lag)
        if isinstance(location, Redirect):
            return redirect_answer(location, raw_path, params)
        if not isinstance(location, Local):
            return unavailable_answer(location)
        if stores.retired(version):
            return unavailable_answer(_switched(store, partition))
        value = stores.get(version, partition, key, standby=location.role == "standby")
        served_by = served_by_json(location, partition)
        if value is None:
            body = (
                b'{"error":'
                + json.dumps(f"no key {key.decode()!r} in store {store!r}").encode()
                + b',"served_by":'
                + served_by
                + b"}"
            )
            return Answer(404, [JSON_TYPE], body)
        return Answer(200, [JSON_TYPE], found_body(key.decode(), value, served_by))

    async def lookup_after(
        self, raw_path: bytes, query_string: bytes, header: bytes | None, wait_s: float
    ) -> Answer | None:
        """:meth:`lookup`, answered only with state that includes the consistency token of
        the query (``consistent_with``) or ``header``: this instance's copy of the key's
        partition is awaited up to ``wait_s`` seconds first
        (:mod:`foldstream.query_api.consistency`)."""
        target = store_path(raw_path, b"keys/")
        if target is None:
            return None
        try:
            token = requested_token(query_string, header)
            version = None
            if token is not None:
                pending, version = await self._await_token(query_string, *target, token, wait_s)
                if pending is not None:
                    return pending
            # The version the token was awaited on: a switch meanwhile must not answer from
            # another, which may not include it yet.
            return self._lookup(raw_path, query_string, *target, version)
        except InvalidRequest as exc:
            return error_answer(exc.status, str(exc))
        except StoreNotFound as exc:
            return error_answer(404, str(exc))

    async def _await_token(
        self, query_string: bytes, raw_store: bytes, raw_key: bytes, token: Token, wait_s: float
    ) -> tuple[Answer | None, str]:
        """None once the copy here that answers the lookup (or range or windows read) includes
        ``token`` (or when it is answered elsewhere: redirected, or 503); else the 503 to
        answer. With it, the store's version awaited."""
        store = self.limits.name(raw_store, "store name")
        route = _route_of(raw_key)
        if route is not LOOKUP:  # a range or windows read: of the key before it
            raw_key = raw_key[: -len(WINDOWS if raw_key.endswith(WINDOWS) else RANGE)]
        key = self.limits.key(raw_key)
        _, max_lag = routing_params(query_string, route)
        stores, locator = self._started()
        version = stores.serving(store)
        info = stores.info(version)
        check_topic(token, store, info.topic)
        partition = info.partition_of(key)
        location = locator.locate(info.topic, partition, max_lag=max_lag)
        if not isinstance(location, Local):
            return None, version  # the lookup redirects (keeping the token) or answers 503
        standby = location.role == "standby"
        pending = await wait_for_token(
            stores, version, info.topic, partition, token, wait_s, standby=standby
        )
        return pending, version

    def _ordered(
        self,
        raw_path: bytes,
        query_string: bytes,
        store: str,
        raw_key: bytes,
        version: str | None,
    ) -> Answer:
        """The answer to a range or windows read of ``raw_key`` (with its ``/range`` or
        ``/windows``) from ``version`` of ``store`` (None: the one serving now)."""
        windows = raw_key.endswith(WINDOWS)
        key = self.limits.key(raw_key[: -len(WINDOWS if windows else RANGE)])
        params, max_lag = routing_params(query_string, _route_of(raw_key))
        stores, locator = self._started()
        version = version or stores.serving(store)
        info = stores.info(version)
        wanted = "windowed" if windows else "ordered"
        if info.kind != wanted:
            return error_answer(400, _not_a(store, wanted, info))
        span = span_of(info, key, ordered_params(query_string), self.limits, windows)
        partition = info.partition_of(key)
        location = locator.locate(info.topic, partition, max_lag=max_lag)
        if not isinstance(location, Local):
            return _elsewhere(location, raw_path, params)
        if stores.retired(version):
            return unavailable_answer(_switched(store, partition))
        standby = location.role == "standby"
        start = span.start
        if windows:  # windows past retention are not answered, even before their deletion
            start = max(
                start,
                span.prefix + encode_int(_first_kept(stores, version, info, partition, standby)),
            )
        found = stores.scan(version, partition, start, span.end, span.limit + 1, standby=standby)
        body = entries_body(key.decode(), info, span, found, served_by_json(location, partition))
        return Answer(200, [JSON_TYPE], body)

    def batch(self, raw_path: bytes, query_string: bytes, body: bytes) -> Answer | None:
        """The answer to a batch lookup, ``POST raw_path`` of ``body``; None if ``raw_path``
        is no store's batch path."""
        return self._batch(raw_path, query_string, body, None)

    def _batch(
        self,
        raw_path: bytes,
        query_string: bytes,
        body: bytes,
        not_yet: int | None,
        version: str | None = None,
    ) -> Answer | None:
        """``version``: the store's version to read (None: the one serving now)."""
        target = store_path(raw_path, b"keys")
        if target is None or target[1]:
            return None
        limits, raw_store = self.limits, target[0]
        try:
            limits.check_url(raw_path, query_string)
            if query_string:
                BATCH.checked(query_string)
            store = self._names.get(raw_store) or limits.name(raw_store, "store name")
            if len(body) > limits.max_body_bytes:
                raise InvalidRequest(limits.too_large(len(body)), status=413)
            stores, locator = self._started()
            version = version or stores.serving(store)
            if (info := stores.info(version)).kind != "point":
                return error_answer(400, _not_a(store, "point", info))
            self._names[raw_store] = store  # a store's: the cache stays as small as the layout
            if stores.retired(version):
                return error_answer(
                    503,
                    f"store {store!r} switched to a newer version: ask again",
                    [(b"retry-after", b"1"), NO_STORE],
                )
            answer = batch_answer(stores, locator, version, body, limits, not_yet)
            return Answer(200, [JSON_TYPE], answer)
        except InvalidRequest as exc:
            return error_answer(exc.status, str(exc))
        except StoreNotFound as exc:
            return error_answer(404, str(exc))

    async def batch_after(
        self, raw_path: bytes, query_string: bytes, body: bytes, header: bytes | None, wait_s: float
    ) -> Answer | None:
        """:meth:`batch`, with the values of the consistency token's partition answered only
        from a copy that includes it (else listed as unavailable)."""
        target = store_path(raw_path, b"keys")
        if target is None or target[1]:
            return None
        try:
            token = requested_token(query_string, header)
            if token is None:
                return self.batch(raw_path, query_string, body)
            self.limits.check_url(raw_path, query_string)
            BATCH.checked(query_string)  # before waiting for the token
            store = self.limits.name(target[0], "store name")
            if len(body) > self.limits.max_body_bytes:
                raise InvalidRequest(self.limits.too_large(len(body)), status=413)
            stores, locator = self._started()
            version = stores.serving(store)
            info = stores.info(version)
            check_topic(token, store, info.topic)
            not_yet = None
            if token.partition < info.partitions:
                location = locator.locate(info.topic, token.partition)
                if isinstance(location, Local):
                    pending = await wait_for_token(
                        stores, version, info.topic, token.partition, token, wait_s, standby=False
                    )
                    not_yet = None if pending is None else token.partition
            return self._batch(raw_path, query_string, body, not_yet, version)
        except InvalidRequest as exc:
            return error_answer(exc.status, str(exc))
        except StoreNotFound as exc:
            return error_answer(404, str(exc))

    def owner_target(self, raw_path: bytes, query_string: bytes) -> tuple[str, bytes] | None:
        """The store name and key of ``GET /stores/{store}/owners/{key}`` (InvalidRequest if
        either breaks a rule); None if it is no such path."""
        target = store_path(raw_path, b"owners/")
        if target is None:
            return None
        self.limits.check_url(raw_path, query_string)
        if query_string:
            OWNERS.checked(query_string)
        return self.limits.name(target[0], "store name"), self.limits.key(target[1])


def _route_of(raw_key: bytes) -> RouteParams:
    """What a ``GET /stores/{store}/keys/{raw_key}`` reads: a key, a range or windows."""
    if raw_key.endswith(RANGE):
        return RANGE_READ
    return WINDOWS_READ if raw_key.endswith(WINDOWS) else LOOKUP


def routing_params(query_string: bytes, route: RouteParams) -> tuple[Params, MaxLag]:
    """The query's parameters, each one ``route`` takes, and its ``max_lag``, ``hops``
    checked (InvalidRequest)."""
    if not query_string:  # most lookups have none: spared the parsing
        return [], None
    params = route.checked(query_string)
    max_lag = max_lag_param(last(params, "max_lag"))
    count(HOPS_PARAM, last(params, HOPS_PARAM) or None)
    return params, max_lag


def _elsewhere(location: Location, raw_path: bytes, params: Params) -> Answer:
    if isinstance(location, Redirect):
        return redirect_answer(location, raw_path, params)
    return unavailable_answer(location)  # type: ignore[arg-type]


def _first_kept(
    stores: StoreReaders, store: str, info: StoreInfo, partition: int, standby: bool
) -> int:
    """The earliest window start of ``partition`` still within retention."""
    raw = stores.get(store, partition, STREAM_TIME, standby=standby)
    if raw is None:
        return -(2**63)
    return decode_int(raw) - (info.window_ms or 0) - (info.retention_ms or 0) + 1


def _switched(store: str, partition: int) -> Unavailable:
    """The version a read waited on was retired meanwhile (its copies are gone): ask again."""
    return Unavailable(partition, f"store {store!r} switched to a newer version: ask again")


def _not_a(store: str, wanted: str, info: StoreInfo) -> str:
    """What a read meant for a ``wanted`` store answers on a store of ``info.kind``."""
    reads = {
        "point": f"look its keys up with GET /stores/{store}/keys/{{key}}",
        "ordered": f"read its ranges with GET /stores/{store}/keys/{{key}}/range",
        "windowed": f"read its windows with GET /stores/{store}/keys/{{key}}/windows",
    }
    return f"store {store!r} is not {wanted} but {info.kind}: {reads[info.kind]}"


def served_by_json(location: Local, partition: int) -> bytes:
    """The ``served_by`` object of a lookup answered here: instance, role, partition, lag."""
    return _served_by(location.instance, location.role, partition, location.lag)


@lru_cache(maxsize=4096)  # a few per copy; encoding it per lookup was costly (docs/benchmarks.md)
def _served_by(instance: str, role: str, partition: int, lag: int | None) -> bytes:
    return json.dumps(
        {"instance": instance, "role": role, "partition": partition, "lag": lag}
    ).encode()


def found_body(key: str, value: bytes, served_by: bytes) -> bytes:
    """The body of a lookup's 200 answer. The stored bytes are JSON already: they are answered
    without decoding and re-encoding them."""
    # encode_basestring_ascii: what json.dumps does with a str, without its dispatch.
    quoted = encode_basestring_ascii(key).encode()
    return b"".join((b'{"key":', quoted, b',"value":', value, b',"served_by":', served_by, b"}"))
