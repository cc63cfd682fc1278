"""The synchronous client: :class:`FoldstreamClient`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Unpack

import httpx
from tenacity import Retrying

from foldstream.api_models import (
    ClusterMap,
    CommandAnswer,
    LookupAnswer,
    OwnersAnswer,
    RangeAnswer,
    Readiness,
    RebuildAnswer,
    StoresAnswer,
    WindowsAnswer,
)
from foldstream.client.flows import (
    Attempts,
    Batch,
    BatchLookup,
    ClientCore,
    Flow,
    ReadOptions,
    Result,
    Send,
    new_idempotency_key,
)
from foldstream.client.policy import give_up, retry_policy
from foldstream.routing import MAX_HOPS, MaxLag

T = TypeVar("T")


class FoldstreamClient:
    """A client of a foldstream cluster, over httpx.

    ``urls``: one or more instances of the service (any of them; the others are learnt from
    ``GET /cluster``). Each request goes to the instance owning its key's partition; a 307 is
    followed (at most ``max_hops``) and a 503 or an unreachable instance retried, honouring
    ``Retry-After``, with the map read again, until ``retry_timeout`` seconds have passed
    (then :class:`~foldstream.client.errors.Unavailable`). ``token``: a bearer token, sent
    only to instances of the cluster. ``route=False``: send every request to the first of
    ``urls`` that answers (a load balancer) and follow its redirects. ``http``: an
    ``httpx.Client`` of your own (timeouts, TLS, event hooks); closed by :meth:`close` only
    when the client made it.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        token: str | None = None,
        retry_timeout: float = 30.0,
        timeout: float = 10.0,
        max_hops: int = MAX_HOPS,
        route: bool = True,
        http: httpx.Client | None = None,
    ) -> None:
        self._core = ClientCore(urls, token=token, max_hops=max_hops, route=route)
        self.retry_timeout = retry_timeout
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=timeout)

    def get(
        self,
        store: str,
        key: str,
        *,
        max_lag: MaxLag = None,
        consistent_with: str | None = None,
    ) -> Any:
        """The value of ``key`` in ``store`` (:class:`KeyNotFound` if it holds none)."""
        return self.lookup(store, key, max_lag=max_lag, consistent_with=consistent_with).value

    def lookup(
        self,
        store: str,
        key: str,
        *,
        max_lag: MaxLag = None,
        consistent_with: str | None = None,
    ) -> LookupAnswer:
        """The whole answer of a lookup: the value and who served it (``max_lag``: a standby
        copy at most that many records behind may answer, ``"any"``: a copy of any lag, even
        unknown; ``consistent_with``: a command's ``token``, answered only with state that
        includes that command)."""
        return self._run(lambda: self._core.lookup(store, key, max_lag, consistent_with))

    def range(self, store: str, key: str, **options: Unpack[ReadOptions]) -> RangeAnswer:
        """A page of ``key``'s entries in ordered store ``store`` whose sort keys are in
        [``start``, ``end``) (either open), in sort key order, at most ``limit``; the answer's
        ``next``, given as ``after``, reads the next page. ``max_lag`` and
        ``consistent_with`` as in :meth:`lookup`."""
        return self._run(lambda: self._core.range(store, key, options))

    def windows(self, store: str, key: str, **options: Unpack[ReadOptions]) -> WindowsAnswer:
        """A page of ``key``'s windows in windowed store ``store`` whose start is in
        [``start``, ``end``) (either open), oldest first; otherwise as :meth:`range`."""
        return self._run(lambda: self._core.windows(store, key, options))

    def get_many(self, store: str, keys: Sequence[str]) -> Batch:
        """The values of ``keys``, asking each owner for its keys (all owners at once)."""
        batch = BatchLookup(self._core, store, keys)
        return self._run(batch.attempt)

    def command(
        self,
        aggregate: str,
        aggregate_id: str,
        command: str,
        arguments: dict[str, Any] | None = None,
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer:
        """Send ``command`` to the aggregate; the events it appended and where they landed.

        It is sent with an ``Idempotency-Key`` (``idempotency_key``, or a new one), and resent
        with it until a definite answer comes, within ``retry_timeout``: the instances apply it
        once and answer every attempt with its first outcome. Without an answer by then,
        :class:`~foldstream.client.errors.OutcomeUnknown` carries the key to resend it with."""
        attempts = Attempts(idempotency_key or new_idempotency_key())
        return self._run(
            lambda: self._core.command(
                aggregate, aggregate_id, command, arguments or {}, expected_version, attempts
            ),
            attempts,
        )

    def cluster(self) -> ClusterMap:
        """The cluster map, read now."""
        return self._run(lambda: self._core.refresh(force=True))

    def owners(self, store: str, key: str) -> OwnersAnswer:
        return self._run(lambda: self._core.owners(store, key))

    def stores(self) -> StoresAnswer:
        return self._run(self._core.stores)

    def rebuild(self, store: str) -> RebuildAnswer:
        """Rebuild the version of ``store`` that answers, beside it: the generation every
        instance builds now (``docs/concepts/versions.md``)."""
        return self._run(lambda: self._core.rebuild(store))

    def ready(self, url: str) -> Readiness:
        """``GET /ready`` of the instance at ``url``."""
        return self._run(lambda: self._core.get("/ready", Readiness, url.rstrip("/")))

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> FoldstreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, flow: Callable[[], Flow[T]], attempts: Attempts | None = None) -> T:
        with give_up(self.retry_timeout, attempts):
            for attempt in Retrying(**retry_policy(self.retry_timeout)):
                with attempt:
                    return self._drive(flow())
        raise AssertionError("unreachable: tenacity reraises")

    def _drive(self, flow: Flow[T]) -> T:
        try:
            sends = next(flow)
            while True:
                sends = flow.send([self._send(send) for send in sends])
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _send(self, send: Send) -> Result:
        try:
            return self._http.request(
                send.method, send.url, content=send.content, headers=self._core.headers(send)
            )
        except httpx.TransportError as exc:
            return exc
