"""Server-side cost from ``/proc``: CPU seconds and peak RSS of a process and all its children."""

from __future__ import annotations

import os
import threading
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants alive now."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, ()))
    return found


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def cpu_seconds(pid: int, *, tree: bool = True) -> float:
    """User + system CPU seconds of ``pid``'s tree (or of ``pid`` alone), counting children
    that already exited and were waited for (``cutime`` + ``cstime``)."""
    total = 0
    for member in process_tree(pid) if tree else [pid]:
        fields = _stat_fields(member)
        if fields is not None:
            # utime, stime, cutime, cstime are fields 14-17 of stat (index 11-14 after the name)
            total += sum(int(f) for f in fields[11:15])
    return total / _TICKS


def _kind(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return "gone"
    if b"java" in command.split(b" ", 1)[0]:
        return "jvm"
    if b"tansu" in command.split(b" ", 1)[0]:
        return "broker"
    if b"pyspark" in command:
        return "spark python workers"
    return "other"


def cpu_by_kind(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid``'s tree split into the JVM, Spark's Python workers, an embedded
    broker and the rest."""
    split: dict[str, float] = {}
    for member in process_tree(pid):
        fields = _stat_fields(member)
        if fields is not None:
            kind = _kind(member)
            split[kind] = split.get(kind, 0.0) + sum(int(f) for f in fields[11:15]) / _TICKS
    return split


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid``'s tree now."""
    total = 0
    for member in process_tree(pid):
        try:
            total += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError):
            continue
    return total


def _own_cpu(pid: int) -> float | None:
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICKS


class CpuMeter:
    """CPU seconds a process tree (``seconds``) and its root alone (``root_seconds``) spend
    between ``__enter__`` and ``__exit__``.

    Each process's own utime + stime is sampled every ``interval`` seconds: a process that
    exits (Spark recycles Python workers) keeps what it was last seen to use, which counting
    ``cutime`` cannot promise (children reaped with SIGCHLD ignored are never added to it).
    """

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.seconds = self.root_seconds = 0.0
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)

    def _sample(self, *, first: bool = False) -> None:
        for member in process_tree(self.pid):
            used = _own_cpu(member)
            if used is None:
                continue
            # A process born during the measurement spent all its CPU inside it.
            self._first.setdefault(member, used if first else 0.0)
            self._last[member] = used

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> CpuMeter:
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.seconds = sum(self._last[p] - self._first[p] for p in self._last)
        self.root_seconds = self._last.get(self.pid, 0.0) - self._first.get(self.pid, 0.0)


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid``'s tree now: shared pages (libraries, forked workers'
    common memory) counted once across the tree rather than once per process as in RSS."""
    total = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, IndexError, ValueError):
            continue
    return total


class PeakRss:
    """Samples the RSS (and PSS) of a process tree in a background thread; ``peak`` and
    ``peak_pss`` are the largest seen."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.peak_pss = max(self.peak_pss, pss_bytes(self.pid))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
