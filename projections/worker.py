"""Helpers for code that runs in Spark's Python workers."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Callable, Iterator

import pyarrow as pa


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: folding builds many short-lived containers, and
    each collection of the older generations walks every object the worker imported (pyspark,
    pyarrow). Those are frozen out of collection on first use."""
    global _frozen
    if not _frozen:
        gc.freeze()
        _frozen = True
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_frozen = False

#: Tasks that handled at least this many records hand their freed memory back afterwards.
LARGE_TASK_RECORDS = 20_000


def _malloc_trim() -> Callable[[int], int] | None:
    try:  # the C library is among the process's own symbols
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except AttributeError:  # not glibc (musl, macOS): nothing to call
        return None


_trim = _malloc_trim()


def after_task(records: int) -> None:
    """Return the heap a large task left free to the system (glibc's ``malloc_trim``).

    Workers are reused for every micro-batch. After a task of a large micro-batch (a rebuild,
    a restore's catch-up) glibc keeps tens of MB of freed heap in each of them: memory the
    instance holds for nothing until the next large task. Trimming costs milliseconds, so small
    tasks skip it (docs/decisions.md, "Memory").
    """
    if _trim is not None and records >= LARGE_TASK_RECORDS:
        _trim(0)


@contextlib.contextmanager
def pandas_hidden() -> Iterator[None]:
    """``import pandas`` fails inside (unless pandas is already imported): for libraries that
    import pandas only to check whether it is there."""
    hidden = _HiddenPandas()
    sys.meta_path.insert(0, hidden)
    try:
        yield
    finally:
        sys.meta_path.remove(hidden)


def arrow_without_pandas() -> None:
    """Settle pyarrow's check for pandas as "not installed" in this process, unless pandas is
    already imported.

    The first time pyarrow converts a Python list, it imports pandas to learn whether the list
    is a pandas object: tens of MB of memory and a quarter of a second of CPU in every Spark
    worker that builds an Arrow batch, for lists that never are. pyarrow still imports pandas
    when asked for it (``to_pandas``), so code that uses pandas is unaffected.
    """
    global _pandas_settled
    if _pandas_settled or "pandas" in sys.modules:
        return
    with pandas_hidden():
        pa.array([0])
    _pandas_settled = True


_pandas_settled = False


class _HiddenPandas:
    """An import hook under which ``import pandas`` fails."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ImportError(f"{name} is hidden while a library checks for it")
