"""What the sections of one bench run share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.procs import PeakRss


@dataclass(frozen=True)
class BenchRun:
    """The console, the load tool (``wrk``'s path, None: the Python generator), the scratch
    directory, the sizes (``--quick`` or full) and the peak memory of each instance measured so
    far, by what it was measured for."""

    console: Console
    wrk: str | None
    tmp: Path
    size: dict[str, Any]
    memory: dict[str, PeakRss] = field(default_factory=dict)

    def step(self, what: str, run: Callable[[], Any]) -> Any:
        """Run ``run`` under a spinner saying ``what``, then print how long it took."""
        started = time.perf_counter()
        with self.console.status(what):
            result = run()
        self.console.print(f"[dim]{what}: {time.perf_counter() - started:.1f}s")
        return result
