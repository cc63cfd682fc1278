"""Helpers for code that runs in Spark's Python workers."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

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
    is a pandas object: 45 MB of memory and 0.25 s of CPU in every Spark worker that builds an
    Arrow batch, for lists that never are. pyarrow still imports pandas when asked for it
    (``to_pandas``), so code that uses pandas is unaffected.
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
