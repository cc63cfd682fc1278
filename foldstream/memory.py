"""A bound on glibc malloc's per-thread arenas, for an instance and the processes it starts."""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

#: glibc's default is 8 per core. Each arena keeps the memory its threads once held, and an
#: instance runs dozens of threads (librdkafka, RocksDB, the store host's connections): with the
#: default, its API process held several times the memory (docs/decisions.md, "Memory").
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # <malloc.h>


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> None:
    """Cap glibc's malloc arenas in this process (arenas made from now on) and, through
    ``MALLOC_ARENA_MAX``, in every process it starts (the JVM, Spark's Python workers). An
    operator's own ``MALLOC_ARENA_MAX`` wins. No-op where the C library is not glibc."""
    chosen = os.environ.setdefault("MALLOC_ARENA_MAX", str(arenas))
    if not chosen.isdigit():
        log.warning("MALLOC_ARENA_MAX=%r is not a number; malloc arenas are not capped", chosen)
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    if mallopt(_M_ARENA_MAX, int(chosen)) != 1:
        log.warning("mallopt(M_ARENA_MAX, %s) failed; malloc arenas are not capped", chosen)
