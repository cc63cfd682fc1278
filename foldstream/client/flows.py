"""What the client does, without doing any I/O itself: the sync and async clients drive these.

Each operation is a generator that yields the HTTP requests it wants sent (a list: a batch
lookup asks several owners at once) and gets back, for each, the response or the transport
error; it returns the operation's result, raises a typed error (:mod:`.errors`), or raises
:class:`Retry` when the whole attempt should be made again after a delay (a 503, an instance
unreachable, keys nobody owned yet). The clients retry with tenacity until their
``retry_timeout``. One implementation serves both clients, so they behave alike.
"""

from __future__ import annotations

import email.utils
import json
import time
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urljoin

import httpx
from pydantic import BaseModel, ValidationError

from foldstream.api_models import (
    BatchAnswer,
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
from foldstream.client import errors
from foldstream.client.params import ReadOptions, read_params
from foldstream.client.routing import Router, origin
from foldstream.routing import MaxLag

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
#: Keys per batch request (an instance takes up to 10,000 by default).
BATCH_CHUNK = 1_000
#: The longest wait the client accepts from a Retry-After.
MAX_WAIT_S = 10.0


@dataclass
class Attempts:
    """The attempts at one command: its ``Idempotency-Key``, and whether one may have been
    applied (its answer lost, or a 503 saying its outcome is unknown)."""

    idempotency_key: str | None = None
    maybe_applied: bool = False


@dataclass(frozen=True)
class Send:
    """One HTTP request. ``idempotent``: sending it twice does no harm (every read, and a
    command with an ``Idempotency-Key`` the instances honour); ``headers``: its own;
    ``attempts``: a command's."""

    method: str
    url: str
    content: bytes | None = None
    idempotent: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    attempts: Attempts = field(default_factory=Attempts)


Result = httpx.Response | httpx.TransportError
#: Transport errors raised before a request could leave: a command may be sent again.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
Flow = Generator[list[Send], list[Result], T]


class Retry(Exception):
    """Make the attempt again in ``after`` seconds; ``reason`` says why."""

    def __init__(self, reason: str, after: float = 0.0) -> None:
        super().__init__(reason)
        self.after = after


def retry_after(response: httpx.Response, default: float = 1.0) -> float:
    """The delay a ``Retry-After`` header asks for (seconds or an HTTP date), within
    ``[0, MAX_WAIT_S]``; ``default`` when there is none or it is unreadable."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return default
    if value.isdigit():
        return min(float(value), MAX_WAIT_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(0.0, min(when.timestamp() - time.time(), MAX_WAIT_S))


def decoded(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


_ERRORS: dict[int, type[errors.ClientError]] = {
    400: errors.BadRequest,
    401: errors.Unauthorized,
    404: errors.NotFound,
    409: errors.VersionConflict,
    413: errors.BadRequest,
    414: errors.BadRequest,
    422: errors.Rejected,
}
#: The header naming a command, so that it can be resent safely.
IDEMPOTENCY_KEY = "Idempotency-Key"


def new_idempotency_key() -> str:
    """A key for one command (a random UUID)."""
    return str(uuid.uuid4())


def answer(response: httpx.Response, model: type[M], ok: int = 200) -> M:
    """The ``ok`` (200) answer as ``model``, or the typed error its status means."""
    if response.status_code == ok:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise errors.ClientError(f"unexpected answer: {exc}", 200, decoded(response)) from None
    body = decoded(response)
    message = body.get("error", str(body)) if isinstance(body, dict) else str(body)
    kind = _ERRORS.get(response.status_code, errors.ClientError)
    if response.status_code == 404 and isinstance(body, dict) and "served_by" in body:
        kind = errors.KeyNotFound
    if response.status_code == 422 and isinstance(body, dict) and "idempotency_key" in body:
        kind = errors.IdempotencyKeyReused
    raise kind(f"{response.status_code}: {message}", response.status_code, body)


def _path(*segments: str) -> str:
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


class ClientCore:
    """The client's state (its :class:`Router`) and operations, as flows."""

    def __init__(
        self, urls: str | Sequence[str], *, token: str | None, max_hops: int, route: bool
    ) -> None:
        self.router = Router([urls] if isinstance(urls, str) else list(urls), route=route)
        self.token = token
        self.max_hops = max_hops

    def headers(self, send: Send) -> dict[str, str]:
        """Headers of ``send``: its own, and the token only to instances the client knows."""
        headers = {"accept": "application/json", **dict(send.headers)}
        if self.token is not None and self.router.is_member(send.url):
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    # -- the map -------------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> Flow[ClusterMap]:
        """Read ``GET /cluster`` from the first instance that answers, if the map is stale:
        from the first whose view of the cluster is current, else from the first at all (an
        instance cut off from the cluster may name owners replaced since)."""
        router = self.router
        if router.map is not None and not router.stale and not force:
            return router.map
        reasons = []
        out_of_date: ClusterMap | None = None
        for url in router.instances():
            (result,) = yield [Send("GET", url + "/cluster")]
            if isinstance(result, httpx.TransportError):
                router.mark_down(url)
                reasons.append(f"{url}: {result!r}")
                continue
            if result.status_code in (401, 403):
                answer(result, ClusterMap)  # raises Unauthorized
            if result.status_code == 200:
                cluster = answer(result, ClusterMap)
                if cluster.view_current:
                    router.update(cluster)
                    return cluster
                out_of_date = out_of_date or cluster
                continue
            reasons.append(f"{url}: {result.status_code}")
        if out_of_date is not None:
            router.update(out_of_date)
            return out_of_date
        raise Retry(f"no instance answered GET /cluster: {reasons}", after=0.5)

    # -- one request, redirects followed ------------------------------------------------------

    def exchange(self, send: Send) -> Flow[httpx.Response]:
        """Send ``send``, following 307s up to the hop limit; :class:`Retry` on a 503 or an
        unreachable instance (for a command only when nothing can have been appended)."""
        current = send
        for _ in range(self.max_hops + 1):
            (result,) = yield [current]
            if isinstance(result, httpx.TransportError):
                self.router.mark_down(current.url)
                sent = not isinstance(result, _NOT_SENT)
                if send.idempotent or not sent:
                    send.attempts.maybe_applied |= sent
                    raise Retry(f"{origin(current.url)} unreachable: {result!r}", after=0.1)
                raise errors.OutcomeUnknown(
                    f"the connection to {origin(current.url)} broke after the command was sent "
                    f"({result!r}): resend it with expected_version to apply it at most once"
                )
            if result.status_code == 503:
                self.router.stale = True
                body = decoded(result)
                unknown = not (isinstance(body, dict) and "partition" in body)
                if not send.idempotent and unknown:
                    raise errors.OutcomeUnknown(f"503: {body}", 503, body)  # see Retry-After
                send.attempts.maybe_applied |= unknown
                raise Retry(f"{origin(current.url)} answered 503: {body}", retry_after(result))
            if result.status_code != 307:
                return result
            self.router.stale = True
            target = urljoin(current.url, result.headers.get("location", ""))
            if not self.router.is_member(target):
                yield from self.refresh(force=True)
                if not self.router.is_member(target):
                    raise errors.TooManyRedirects(f"redirected to {target}: not a member", 307)
            current = replace(current, url=target)
        raise errors.TooManyRedirects(f"more than {self.max_hops} redirects from {send.url}", 307)

    # -- operations ---------------------------------------------------------------------------

    def lookup(
        self, store: str, key: str, max_lag: MaxLag, consistent_with: str | None = None
    ) -> Flow[LookupAnswer]:
        params = read_params(max_lag=max_lag, consistent_with=consistent_with)
        return self.read(store, key, None, params, LookupAnswer)

    def range(self, store: str, key: str, options: ReadOptions) -> Flow[RangeAnswer]:
        return self.read(store, key, "range", read_params(**options), RangeAnswer)

    def windows(self, store: str, key: str, options: ReadOptions) -> Flow[WindowsAnswer]:
        return self.read(store, key, "windows", read_params(**options), WindowsAnswer)

    def read(
        self, store: str, key: str, kind: str | None, params: dict[str, str], model: type[M]
    ) -> Flow[M]:
        """``GET /stores/{store}/keys/{key}`` (``kind`` None) or ``.../{key}/{kind}`` (a range
        or windows read) with ``params``, sent to the key's owner."""
        yield from self.refresh()
        base = self.router.store_owner(store, key) or self.router.any_instance()
        path = _path("stores", store, "keys", key) + ("" if kind is None else f"/{kind}")
        query = f"?{urlencode(params)}" if params else ""
        response = yield from self.exchange(Send("GET", base + path + query))
        return answer(response, model)

    def command(
        self,
        aggregate: str,
        aggregate_id: str,
        command: str,
        arguments: dict[str, Any],
        expected_version: int | None,
        attempts: Attempts | None = None,
    ) -> Flow[CommandAnswer]:
        """Send a command; with ``attempts``' key, resent until it has a definite answer
        (when the instances honour the key: the cluster map gives its retention)."""
        attempts = attempts or Attempts()
        idempotency_key = attempts.idempotency_key
        cluster = yield from self.refresh()
        base = self.router.command_owner(aggregate_id) or self.router.any_instance()
        query = "" if expected_version is None else f"?expected_version={int(expected_version)}"
        path = _path("commands", aggregate, aggregate_id, command) + query
        body = json.dumps(arguments).encode()
        headers = () if idempotency_key is None else ((IDEMPOTENCY_KEY, idempotency_key),)
        layout = cluster.commands
        retention = None if layout is None else layout.idempotency_retention_s
        keyed = idempotency_key is not None and retention is not None
        send = Send("POST", base + path, body, keyed, headers, attempts)
        response = yield from self.exchange(send)
        return answer(response, CommandAnswer)

    def get(self, path: str, model: type[M], url: str | None = None) -> Flow[M]:
        """``GET path`` on ``url`` (default: any instance), as ``model``."""
        yield from self.refresh()
        response = yield from self.exchange(Send("GET", (url or self.router.any_instance()) + path))
        if model is Readiness and response.status_code == 503:
            return model.model_validate_json(response.content)
        return answer(response, model)

    def owners(self, store: str, key: str) -> Flow[OwnersAnswer]:
        return self.get(_path("stores", store, "owners", key), OwnersAnswer)

    def stores(self) -> Flow[StoresAnswer]:
        return self.get("/stores", StoresAnswer)

    def rebuild(self, store: str) -> Flow[RebuildAnswer]:
        """Ask any instance to rebuild ``store`` (202: the generation every instance builds)."""
        yield from self.refresh()
        url = self.router.any_instance() + _path("stores", store, "rebuilds")
        response = yield from self.exchange(Send("POST", url, b"", idempotent=False))
        return answer(response, RebuildAnswer, ok=202)


@dataclass
class Batch:
    """What a batch lookup found: ``values`` by key, and the ``missing`` keys."""

    values: dict[str, Any]
    missing: list[str]


class BatchLookup:
    """A batch lookup across owners, kept across attempts: each attempt asks the owners of the
    keys still pending, at once, and keeps what they answered."""

    def __init__(self, core: ClientCore, store: str, keys: Sequence[str]) -> None:
        self.core = core
        self.store = store
        self.pending = dict.fromkeys(keys)
        self.found = Batch({}, [])
        self.hints: dict[str, str] = {}  # key -> the owner an instance named ("elsewhere")

    def _requests(self) -> list[tuple[Send, list[str]]]:
        router = self.core.router
        groups: dict[str, list[str]] = {}
        fallback = router.any_instance()
        for key in self.pending:
            owner = self.hints.get(key) or router.store_owner(self.store, key) or fallback
            groups.setdefault(owner, []).append(key)
        path = _path("stores", self.store, "keys")
        requests = []
        for base, keys in groups.items():
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start : start + BATCH_CHUNK]
                requests.append((Send("POST", base + path, json.dumps(chunk).encode()), chunk))
        return requests

    def attempt(self) -> Flow[Batch]:
        yield from self.core.refresh()
        requests = self._requests()
        results = yield [send for send, _ in requests]
        delay = 0.0
        for (send, keys), result in zip(requests, results, strict=True):
            if isinstance(result, httpx.TransportError):
                self.core.router.mark_down(send.url)
                self._forget_hints(keys)
                delay = max(delay, 0.1)
            elif result.status_code == 503:
                self.core.router.stale = True
                delay = max(delay, retry_after(result))
            else:
                delay = max(delay, self._take(answer(result, BatchAnswer), keys))
        if self.pending:
            raise Retry(f"{len(self.pending)} keys not answered yet", after=delay)
        return self.found

    def _take(self, batch: BatchAnswer, asked: list[str]) -> float:
        self.found.values.update(batch.values)
        self.found.missing += batch.missing
        for key in [*batch.values, *batch.missing]:
            self.pending.pop(key, None)
        for url, keys in batch.elsewhere.items():
            self.core.router.stale = True
            self.hints.update(dict.fromkeys(keys, url.rstrip("/")))
        if batch.unavailable:
            self.core.router.stale = True
            self._forget_hints(batch.unavailable)
            return 1.0
        return 0.0

    def _forget_hints(self, keys: list[str]) -> None:
        for key in keys:
            self.hints.pop(key, None)
