"""Which partitions the command handler writes, kept in line with what the cluster gives it.

The cluster says which partitions this instance owns (:meth:`CommandPartitions.own`, called
with the whole set every time). A partition given up is closed at once, before ``own`` returns:
its transaction in flight finishes, then nothing more is appended, so another instance may take
it. A partition gained is replayed in the background, one at a time, and retried with a backoff
until it works or is no longer wanted (a replay stops early when its partition is given up
meanwhile); so is a partition the handler gave up by itself after a failed transaction, after
``fenced_wait_s`` when another writer fenced it (this instance may have stood still and lost
the partition: by then the cluster says so, and taking it at once would fence the new owner).
Nothing is taken while ``may_take()`` is false (the instance's cluster view is not current: it
may have stood still and lost its partitions without knowing yet). No
partition owned here is left without a writer by a failure, and none waits behind another's
replay to be given up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from foldstream.backoff import Backoff
from foldstream.commands.handler import CommandHandler
from foldstream.errors import FoldstreamError, PartitionFenced

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5


class CommandPartitions:
    """Owns ``handler``'s partitions for the cluster (see the module)."""

    def __init__(
        self,
        handler: CommandHandler,
        *,
        fenced_wait_s: float = 3.0,
        may_take: Callable[[], bool] = lambda: True,
    ) -> None:
        self.handler = handler
        self.fenced_wait_s = fenced_wait_s
        self.may_take = may_take
        handler.on_released = self._released
        self._wanted: frozenset[int] = frozenset()
        self._retry: dict[int, Backoff] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="command-partitions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def own(self, partitions: Iterable[int]) -> None:
        """Own exactly ``partitions`` (see the module)."""
        wanted = frozenset(partitions)
        with self._lock:
            dropped = self._wanted - wanted
            self._wanted = wanted
            for partition in dropped:
                self._retry.pop(partition, None)
        if dropped:
            self.handler.revoke(dropped)
        if wanted - self.handler.owned():
            self._wake.set()

    def owned(self) -> frozenset[int]:
        """The partitions accepting commands (replayed)."""
        return self.handler.owned()

    def idempotency_retention_s(self) -> float:
        """How long the handler remembers commands' Idempotency-Keys at least."""
        return self.handler.retention.seconds

    def wanted(self, partition: int) -> bool:
        return partition in self._wanted and not self._stopping.is_set()

    def _released(self, partition: int, error: FoldstreamError) -> None:
        # On the event loop: the handler gave the partition up after a failed transaction.
        wait = self.fenced_wait_s if isinstance(error, PartitionFenced) else 0.0
        log.warning(
            "partition %d gave up its writer (%s); replaying it again in %.1fs",
            partition,
            error,
            wait,
        )
        if wait:
            with self._lock:
                if partition in self._wanted:
                    self._retry[partition] = Backoff(retry_at=time.monotonic() + wait)
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(IDLE_WAIT_S)
            self._wake.clear()
            for partition in self._due():
                if self._stopping.is_set():
                    return
                self._take(partition)

    def _due(self) -> list[int]:
        if not self.may_take():
            return []  # checked again at the next wake (IDLE_WAIT_S at most)
        now = time.monotonic()
        with self._lock:
            missing = self._wanted - self.handler.owned()
            return sorted(p for p in missing if p not in self._retry or self._retry[p].due(now))

    def _take(self, partition: int) -> None:
        try:
            self.handler.assign([partition], still_wanted=self.wanted)
        except Exception as exc:  # noqa: BLE001 - retried after the backoff while still wanted
            with self._lock:
                if partition not in self._wanted:
                    return
                delay = self._retry.setdefault(partition, Backoff()).failed(time.monotonic())
            # The type too: some errors say nothing else (an AssertionError hid a bug here).
            log.warning(
                "taking partition %d for commands failed (%s: %s); again in %.1fs",
                partition,
                type(exc).__name__,
                exc,
                delay,
            )
            return
        with self._lock:
            self._retry.pop(partition, None)
