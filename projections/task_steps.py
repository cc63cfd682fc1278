"""Where a projection task's time goes, step by step, for the instance's metrics.

A micro-batch's task waits for Spark's input (which includes starting the Python worker that
reads the records), reads the values it folds from the store host, folds, waits for the
changelog's acknowledgements and commits. Spark reports only the whole (``addBatch``); the task
measures its steps and reports them to the store host, which hands them to the instance's
``foldstream_projection_task_seconds{store,step}``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

#: The steps a task reports, in the order a task goes through them.
STEPS = ("input", "read", "fold", "changelog", "commit")

T = TypeVar("T")


class TaskSteps:
    """Seconds spent in each of :data:`STEPS`, summed over a task's chunks."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(STEPS, 0.0)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Count the time inside towards ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started

    def waited(self, items: Iterable[T], name: str = "input") -> Iterator[T]:
        """``items``, counting the time spent waiting for each towards ``name``: for an
        iterator fed by Spark, the task's wait for its input."""
        iterator = iter(items)
        while True:
            with self.step(name):
                item = next(iterator, _END)
            if item is _END:
                return
            yield item  # type: ignore[misc]


_END: object = object()
