"""The query load of the cluster sentences (``When clients keep querying every key of store
"s" on every instance``, :mod:`foldstream.testing.cluster_steps`): threads asking every
instance for every key, as a client would, counting what they see while instances are killed,
join or leave.

A client follows redirects (up to :data:`~foldstream.routing.MAX_HOPS`) and sees the answer at
the end: a 200, a 503 (with ``Retry-After`` or not: counted apart), or a redirect into an
instance that is gone. Redirects into a dead instance are noted with the time their request was
sent: one sent before the instance died was right when it was answered (in flight at the kill);
one sent after is a redirect into a dead member, which no instance may answer.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from email.message import Message
from typing import TYPE_CHECKING, Any

from foldstream.process import InstanceProcess
from foldstream.routing import MAX_HOPS
from foldstream.testing.scenario import REQUEST_ERRORS

if TYPE_CHECKING:
    from foldstream.testing.cluster_steps import Store

#: The status counted for a 503 without ``Retry-After``, and for a redirect into a member that
#: was dead when the request was sent.
NO_RETRY_AFTER = "503 without Retry-After"
TO_THE_DEAD = "307 to a dead instance"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 307 comes back as an HTTPError


_opener = urllib.request.build_opener(_NoRedirects)


def request(url: str, data: bytes | None = None, timeout: float = 10.0) -> tuple[int, Message, Any]:
    """``GET url`` (``POST`` with ``data``) without following redirects: its status, headers
    and JSON body."""
    try:
        sent = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
        with _opener.open(sent, timeout=timeout) as response:
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        try:
            return exc.code, exc.headers, json.loads(payload or b"null")
        except ValueError:
            return exc.code, exc.headers, payload.decode(errors="replace")


class QueryLoad:
    """Threads querying every key of a store on every instance, round after round (with
    ``max_lag``: each key a second time with that ``max_lag``), following redirects; they count
    the final statuses seen (or the error's name) and note every wrong answer."""

    def __init__(
        self,
        members: list[InstanceProcess],
        store: Store,
        expected: dict[str, Any],
        *,
        max_lag: int | None = None,
    ):
        self.store = store
        self.expected = expected
        self.max_lag = max_lag
        self.dead: frozenset[str] = frozenset()  # may fail; not redirected to (see mark_dead)
        self.dead_since = 0.0  # when (monotonic) the instances marked dead were dead
        self.statuses: Counter[int | str] = Counter()
        self.by_partition: dict[int, Counter[int | str]] = {}
        #: Reads with ``max_lag``: their statuses, and when each answered 200, by instance
        #: asked and partition.
        self.lagged: Counter[int | str] = Counter()
        self.lagged_answered: dict[tuple[str, int], list[float]] = {}
        #: Redirects into a dead instance: those sent before it died, and the URLs after.
        self.in_flight_to_dead = 0
        self.to_dead: list[str] = []
        self.wrong: list[str] = []
        # The first answers of each status other than 200/307, to say why a scenario failed.
        self.samples: dict[int | str, list[str]] = {}
        self._started = time.monotonic()
        self.rounds = {m.url: 0 for m in members}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(m.url,), name="query-load", daemon=True)
            for m in members
        ]
        for thread in self._threads:
            thread.start()

    def mark_dead(self, url: str) -> None:
        """From now on requests to ``url`` may fail, and redirects to it are not followed."""
        self.dead = self.dead | {url}  # a new set: the threads iterate over the old one

    def _to_dead(self, url: str) -> bool:
        return any(url.startswith(dead) for dead in self.dead)

    def _query(self, base: str, key: str, max_lag: int | None = None) -> int | str | None:
        """The final status of a client's read of ``key`` from ``base`` (None: not counted)."""
        url = base + self.store.path(key) + ("" if max_lag is None else f"?max_lag={max_lag}")
        sent = time.monotonic()
        try:
            for _ in range(MAX_HOPS + 1):
                status, headers, body = request(url)
                if status != 307:
                    break
                url = headers["Location"]
                if self._to_dead(url):
                    return self._redirected_to_dead(url, sent)
        except REQUEST_ERRORS as exc:
            if self._to_dead(url):
                return None
            self._sample(type(exc).__name__, f"{url}: {exc!r}")
            return type(exc).__name__
        seen: int | str = status
        if status == 503 and not headers.get("Retry-After", "").isdigit():
            seen = NO_RETRY_AFTER
        if seen not in (200, 307):
            self._sample(seen, f"{url}: {body}")
        if status == 200 and (body["value"] != self.expected[key] or not _within(body, max_lag)):
            with self._lock:
                self.wrong.append(f"{key} from {url}: {body}")
        return seen

    def _redirected_to_dead(self, url: str, sent: float) -> str | None:
        with self._lock:
            if not self.dead_since or sent < self.dead_since:
                self.in_flight_to_dead += 1  # answered before it died, or as it did
                return None
            self.to_dead.append(f"{time.monotonic() - self.dead_since:.3f}s after: {url}")
        return TO_THE_DEAD

    def _sample(self, status: int | str, what: str) -> None:
        with self._lock:
            seen = self.samples.setdefault(status, [])
            if len(seen) < 5:
                seen.append(f"{time.monotonic() - self._started:.2f}s {what}")

    def _run(self, base: str) -> None:
        try:
            while not self._stop.is_set() and not self._to_dead(base):
                for key in self.expected:
                    self._count(base, key)
                with self._lock:
                    self.rounds[base] += 1
        except Exception as exc:  # noqa: BLE001 - a load that stops must fail the scenario
            with self._lock:
                self.wrong.append(f"querying {base} failed: {exc!r}")

    def _count(self, base: str, key: str) -> None:
        partition = self.store.partition(key)
        seen = self._query(base, key)
        with self._lock:
            if seen is not None:
                self.statuses[seen] += 1
                self.by_partition.setdefault(partition, Counter())[seen] += 1
        if self.max_lag is None:
            return
        lagged = self._query(base, key, self.max_lag)
        with self._lock:
            if lagged is not None:
                self.lagged[lagged] += 1
            if lagged == 200:
                answered = self.lagged_answered.setdefault((base, partition), [])
                answered.append(time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def _within(body: dict[str, Any], max_lag: int | None) -> bool:
    """Whether a 200 came from a copy the read allowed: the active copy, or with ``max_lag`` a
    standby copy known to be within it."""
    served = body["served_by"]
    if served["role"] == "active":
        return True
    lag = served["lag"]
    return (
        served["role"] == "standby" and max_lag is not None and lag is not None and lag <= max_lag
    )
