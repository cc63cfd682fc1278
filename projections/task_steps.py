"""Where a projection task's time goes, step by step, for the instance's metrics.

A micro-batch's task fetches its records from Kafka (nothing to fetch when the micro-batch was
planned with them), decodes them, reads the values it folds from the store host, folds, waits
for the changelog's acknowledgements and commits. Spark reports only the whole (``addBatch``,
which includes starting the task and its Python worker); the task measures its steps and
reports them to the store host, which hands them to the instance's
``foldstream_projection_task_seconds{store,step}``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

#: The steps a task reports, in the order a task goes through them.
STEPS = ("input", "decode", "read", "fold", "changelog", "commit")

T = TypeVar("T")


class TaskSteps:
    """Seconds spent in each of :data:`STEPS`, summed over a task's chunks. A step entered
    inside another counts for itself only: the outer one gets its own time without it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(STEPS, 0.0)
        self._inner: list[float] = []  # per step being timed: the time of steps inside it

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Count the time inside towards ``name``, less the time of steps nested in it."""
        started = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            spent = time.perf_counter() - started
            self.seconds[name] += spent - self._inner.pop()
            if self._inner:
                self._inner[-1] += spent

    def waited(self, items: Iterable[T], name: str) -> Iterator[T]:
        """``items``, counting the time spent producing each towards ``name``: for the
        records a task fetches, the task's wait for its input."""
        iterator = iter(items)
        while True:
            with self.step(name):
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item
