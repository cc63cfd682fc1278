"""Server-side cost from ``/proc``: CPU seconds and peak memory of a process tree."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from foldstream.process import InstanceProcess

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
        return "broker" if b"kafka.Kafka" in command else "jvm"
    if b"pyspark" in command:
        return "spark python workers"
    return "other"


def cpu_by_kind(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid``'s tree split into the JVM, Spark's Python workers, a Kafka
    broker and the rest."""
    split: dict[str, float] = {}
    for member in process_tree(pid):
        fields = _stat_fields(member)
        if fields is not None:
            kind = _kind(member)
            split[kind] = split.get(kind, 0.0) + sum(int(f) for f in fields[11:15]) / _TICKS
    return split


def _own_cpu(pid: int) -> float | None:
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICKS


class CpuMeter:
    """CPU seconds a process tree (``seconds``) and its root alone (``root_seconds``) spend
    between ``__enter__`` and ``__exit__``, and the tree's split by kind of process
    (``by_kind``: ``"root"``, ``"jvm"``, ``"spark python workers"``...).

    Each process's own utime + stime is sampled every ``interval`` seconds: a process that
    exits (Spark recycles Python workers) keeps what it was last seen to use, which counting
    ``cutime`` cannot promise (children reaped with SIGCHLD ignored are never added to it).
    """

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.seconds = self.root_seconds = 0.0
        self.by_kind: dict[str, float] = {}
        self._kinds: dict[int, str] = {}
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
            # Classified again at every sample: a process seen between fork and exec still
            # looks like its parent.
            self._kinds[member] = "root" if member == self.pid else _kind(member)
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
        for member, used in self._last.items():
            kind = self._kinds.get(member, "other")
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + used - self._first[member]


def _rss_and_pss(pid: int) -> tuple[int, int] | None:
    found: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("Rss", "Pss"):
                found[name] = int(value.split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return found.get("Rss", 0), found.get("Pss", 0)


class PeakRss:
    """Samples the memory of a process tree in a background thread.

    ``peak`` is the largest RSS summed over the tree (pages shared between processes, such as
    libraries and what forked Spark workers inherit, counted in each); ``peak_pss`` the largest
    PSS (each shared page split between its sharers: the tree's memory, each page once), and
    ``split`` that PSS by kind of process (the root is ``"instance process"``).
    """

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = self.peak_pss = 0
        self.split: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        rss, split = 0, dict[str, int]()
        for member in process_tree(self.pid):
            sizes = _rss_and_pss(member)
            if sizes is not None:
                kind = "instance process" if member == self.pid else _kind(member)
                rss += sizes[0]
                split[kind] = split.get(kind, 0) + sizes[1]
        pss = sum(split.values())
        self.peak = max(self.peak, rss)
        if pss > self.peak_pss:
            self.peak_pss, self.split = pss, split

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def pid_of(instance: InstanceProcess) -> int:
    """The pid of a started instance's own process (the root of its tree)."""
    assert instance.process is not None
    return instance.process.pid
