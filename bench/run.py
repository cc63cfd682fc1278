"""What the sections of one bench run share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.procs import PeakRss
from bench.report import step


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
        """:func:`bench.report.step` on this run's console."""
        return step(self.console, what, run)
