"""Waiting for a local copy of a store partition to apply a source offset.

A query with a consistency token (:mod:`foldstream.tokens`) may have to wait until the copy it
reads has applied the token's offset. Polling the copy would cost every waiting request a read
every few milliseconds; instead the writers of local copies (the store host after each task's
write, the standby copies after each changelog batch) say what they applied
(:meth:`AppliedOffsets.applied`, from their threads, at the cost of a dictionary test when
nobody waits), and a waiting request is woken on its event loop once its offset is reached. A
waiter checks the copy itself after registering, and again when woken or timed out: a missed
notification (a copy restored or replaced meanwhile) costs at most its timeout, never a wrong
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

StoreKey = tuple[str, int]


@dataclass(eq=False)
class _Waiter:
    offset: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None] = field(repr=False)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AppliedOffsets:
    """Where waiting requests learn that a copy of ``(store, partition)`` applied an offset."""

    def __init__(self) -> None:
        self._waiters: dict[StoreKey, list[_Waiter]] = {}
        self._lock = threading.Lock()

    def applied(self, store: str, partition: int, offset: int) -> None:
        """A local copy of ``(store, partition)`` applied every source offset up to ``offset``
        (any thread)."""
        if not self._waiters:  # nobody waits (a racing waiter checks the copy itself)
            return
        key = (store, partition)
        with self._lock:
            waiting = self._waiters.get(key)
            if not waiting:
                return
            ready = [w for w in waiting if w.offset <= offset]
            if not ready:
                return
            left = [w for w in waiting if w.offset > offset]
            if left:
                self._waiters[key] = left
            else:
                del self._waiters[key]
        for waiter in ready:
            waiter.loop.call_soon_threadsafe(_wake, waiter.future)

    async def wait(
        self,
        store: str,
        partition: int,
        offset: int,
        timeout: float,
        reached: Callable[[], bool],
    ) -> bool:
        """Wait up to ``timeout`` seconds until ``reached()`` (the copy applied ``offset``);
        whether it has."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(offset, loop, loop.create_future())
        key = (store, partition)
        with self._lock:
            self._waiters.setdefault(key, []).append(waiter)
        try:
            if reached():  # registered first: an offset applied from now on wakes it
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.future, timeout)
            return reached()
        finally:
            with self._lock:
                waiting = self._waiters.get(key)
                if waiting is not None and waiter in waiting:
                    waiting.remove(waiter)
                    if not waiting:
                        del self._waiters[key]

    def waiting(self) -> int:
        """Requests waiting now (metrics, tests)."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())
