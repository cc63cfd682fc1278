"""The query load of the cluster sentences (``When clients keep querying every key of store
"s" on every instance``, :mod:`foldstream.testing.cluster_steps`): threads asking every
instance for every key, counting what they see while instances are killed, join or leave."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from foldstream.process import InstanceProcess, http
from foldstream.testing.scenario import REQUEST_ERRORS

if TYPE_CHECKING:
    from foldstream.testing.cluster_steps import Store


class QueryLoad:
    """Threads querying every key of a store on every instance, round after round, without
    following redirects to instances known dead; they count the statuses seen (or the error's
    name) and note every wrong answer."""

    def __init__(self, members: list[InstanceProcess], store: Store, expected: dict[str, Any]):
        self.store = store
        self.expected = expected
        self.dead: frozenset[str] = frozenset()  # may fail; not redirected to (see mark_dead)
        self.statuses: Counter[int | str] = Counter()
        self.by_partition: dict[int, Counter[int | str]] = {}
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

    def _query(self, base: str, key: str) -> int | str | None:
        url = base + self.store.path(key)
        try:
            status, body = http("GET", url, follow_redirects=False, timeout=10)
            if status == 307 and not self._to_dead(body["location"]):
                url = body["location"]
                status, body = http("GET", url, follow_redirects=False, timeout=10)
        except REQUEST_ERRORS as exc:
            if self._to_dead(url):
                return None
            self._sample(type(exc).__name__, f"{url}: {exc!r}")
            return type(exc).__name__
        if status not in (200, 307):
            self._sample(status, f"{url}: {body}")
        if status == 200 and (
            body["value"] != self.expected[key] or body["served_by"]["role"] != "active"
        ):
            with self._lock:
                self.wrong.append(f"{key} from {url}: {body}")
        return status

    def _sample(self, status: int | str, what: str) -> None:
        with self._lock:
            seen = self.samples.setdefault(status, [])
            if len(seen) < 5:
                seen.append(f"{time.monotonic() - self._started:.2f}s {what}")

    def _run(self, base: str) -> None:
        try:
            while not self._stop.is_set() and not self._to_dead(base):
                for key in self.expected:
                    seen = self._query(base, key)
                    if seen is not None:
                        partition = self.store.partition(key)
                        with self._lock:
                            self.statuses[seen] += 1
                            self.by_partition.setdefault(partition, Counter())[seen] += 1
                with self._lock:
                    self.rounds[base] += 1
        except Exception as exc:  # noqa: BLE001 - a load that stops must fail the scenario
            with self._lock:
                self.wrong.append(f"querying {base} failed: {exc!r}")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
