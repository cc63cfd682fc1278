"""The asynchronous client: :class:`AsyncFoldstreamClient`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Unpack

import httpx
from tenacity import AsyncRetrying

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


class AsyncFoldstreamClient:
    """:class:`~foldstream.client.FoldstreamClient` for asyncio (an ``httpx.AsyncClient``):
    the same routing, redirects, retries and errors; a batch lookup asks its owners
    concurrently."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        token: str | None = None,
        retry_timeout: float = 30.0,
        timeout: float = 10.0,
        max_hops: int = MAX_HOPS,
        route: bool = True,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._core = ClientCore(urls, token=token, max_hops=max_hops, route=route)
        self.retry_timeout = retry_timeout
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)

    async def get(
        self,
        store: str,
        key: str,
        *,
        max_lag: MaxLag = None,
        consistent_with: str | None = None,
    ) -> Any:
        answer = await self.lookup(store, key, max_lag=max_lag, consistent_with=consistent_with)
        return answer.value

    async def lookup(
        self,
        store: str,
        key: str,
        *,
        max_lag: MaxLag = None,
        consistent_with: str | None = None,
    ) -> LookupAnswer:
        return await self._run(lambda: self._core.lookup(store, key, max_lag, consistent_with))

    async def range(self, store: str, key: str, **options: Unpack[ReadOptions]) -> RangeAnswer:
        """A page of ``key``'s entries in ordered store ``store`` whose sort keys are in
        [``start``, ``end``) (either open), in sort key order, at most ``limit``; the answer's
        ``next``, given as ``after``, reads the next page. ``max_lag`` and
        ``consistent_with`` as in :meth:`lookup`."""
        return await self._run(lambda: self._core.range(store, key, options))

    async def windows(self, store: str, key: str, **options: Unpack[ReadOptions]) -> WindowsAnswer:
        """A page of ``key``'s windows in windowed store ``store`` whose start is in
        [``start``, ``end``) (either open), oldest first; otherwise as :meth:`range`."""
        return await self._run(lambda: self._core.windows(store, key, options))

    async def get_many(self, store: str, keys: Sequence[str]) -> Batch:
        return await self._run(BatchLookup(self._core, store, keys).attempt)

    async def command(
        self,
        aggregate: str,
        aggregate_id: str,
        command: str,
        arguments: dict[str, Any] | None = None,
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer:
        """Send ``command`` to the aggregate (see the sync client: the same key and retries)."""
        attempts = Attempts(idempotency_key or new_idempotency_key())
        return await self._run(
            lambda: self._core.command(
                aggregate, aggregate_id, command, arguments or {}, expected_version, attempts
            ),
            attempts,
        )

    async def cluster(self) -> ClusterMap:
        return await self._run(lambda: self._core.refresh(force=True))

    async def owners(self, store: str, key: str) -> OwnersAnswer:
        return await self._run(lambda: self._core.owners(store, key))

    async def stores(self) -> StoresAnswer:
        return await self._run(self._core.stores)

    async def rebuild(self, store: str) -> RebuildAnswer:
        """Rebuild the version of ``store`` that answers, beside it (see the sync client)."""
        return await self._run(lambda: self._core.rebuild(store))

    async def ready(self, url: str) -> Readiness:
        return await self._run(lambda: self._core.get("/ready", Readiness, url.rstrip("/")))

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncFoldstreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, flow: Callable[[], Flow[T]], attempts: Attempts | None = None) -> T:
        with give_up(self.retry_timeout, attempts):
            async for attempt in AsyncRetrying(**retry_policy(self.retry_timeout)):
                with attempt:
                    return await self._drive(flow())
        raise AssertionError("unreachable: tenacity reraises")

    async def _drive(self, flow: Flow[T]) -> T:
        try:
            sends = next(flow)
            while True:
                results = await asyncio.gather(*(self._send(send) for send in sends))
                sends = flow.send(list(results))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _send(self, send: Send) -> Result:
        try:
            return await self._http.request(
                send.method, send.url, content=send.content, headers=self._core.headers(send)
            )
        except httpx.TransportError as exc:
            return exc
