"""Helpers for code that runs in Spark's Python workers."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: folding builds many short-lived containers, and
    each collection of the older generations walks every object the worker imported (pyspark,
    pyarrow, pandas). Those are frozen out of collection on first use."""
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
