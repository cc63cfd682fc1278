"""Process trees from ``/proc`` (Linux): what a process started, directly or not, and what it
used, for tests that signal only what they started."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """The processes descended from ``pid`` (children, their children...), alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def started_at(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the PID, it names one process even
    after the PID is reused."""
    fields = proc_stat(pid)
    return None if fields is None else int(fields[19])


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` alone, in clock ticks (0 once it is gone)."""
    fields = proc_stat(pid)
    return 0 if fields is None else int(fields[11]) + int(fields[12])


def command_line(pid: int) -> list[str]:
    """The arguments ``pid`` was started with (empty once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def signal_all(pids: list[int], signum: int) -> None:
    """Send ``signum`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
