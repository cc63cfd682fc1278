"""The members' reports of the membership bench (:mod:`bench.membership`), replayed in time
order: when every partition had exactly one owner that every member agreed on, when a member's
partitions moved, and which writes acted on stale ownership.

Every report is stamped with the system-wide monotonic clock by the member that made it
(:mod:`bench.membership_writers`): the times of different processes compare directly.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

#: A member's report: its index and the JSON object it printed.
Report = tuple[int, dict[str, Any]]
#: The errors of a write refused because a newer writer took its ``transactional.id``.
FENCED = frozenset({"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"})


@dataclass
class Timeline:
    """Every report of every member of one run, appended as they arrive."""

    partitions: int
    reports: list[Report] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def follow(self, index: int, stream: IO[bytes]) -> threading.Thread:
        """Append member ``index``'s reports from ``stream`` until it ends (a thread)."""

        def read() -> None:
            for line in stream:
                try:
                    report = json.loads(line)
                    float(report["t"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line that is not a report (a library printing): not ours
                with self._lock:
                    self.reports.append((index, report))

        thread = threading.Thread(target=read, name=f"member-{index}", daemon=True)
        thread.start()
        return thread

    def ordered(self, until: float) -> list[Report]:
        with self._lock:
            reports = list(self.reports)
        return sorted((r for r in reports if r[1]["t"] <= until), key=lambda r: r[1]["t"])

    def save(self, path: Path) -> None:
        """Every report, one JSON line each, in time order (for a closer look afterwards)."""
        lines = [json.dumps({"member": i, **r}) for i, r in self.ordered(float("inf"))]
        path.write_text("\n".join(lines) + "\n")

    def seen(self, index: int, event: str) -> bool:
        with self._lock:
            return any(i == index and r["ev"] == event for i, r in self.reports)


@dataclass
class State:
    """What each member owned and saw at one moment of the replay."""

    owned: dict[int, frozenset[int]] = field(default_factory=dict)
    views: dict[int, dict[int, int | None]] = field(default_factory=dict)
    #: When each member last gained each partition it owns: (member, partition) -> time.
    gained: dict[tuple[int, int], float] = field(default_factory=dict)

    def apply(self, index: int, report: Mapping[str, Any]) -> None:
        if report["ev"] == "owned":
            owned = frozenset(int(p) for p in report["owned"])
            for p in owned - self.owned.get(index, frozenset()):
                self.gained[index, p] = float(report["t"])
            self.owned[index] = owned
        elif report["ev"] == "view":
            self.views[index] = {int(p): m for p, m in report["owners"].items()}

    def owners(self, members: Iterable[int]) -> dict[int, list[int]]:
        """Partition -> the members among ``members`` that own it."""
        found: dict[int, list[int]] = {}
        for m in members:
            for p in self.owned.get(m, ()):
                found.setdefault(p, []).append(m)
        return found

    def single_owners(self, members: Collection[int], partitions: int) -> dict[int, int] | None:
        """Each partition's one owner among ``members``, if every partition has exactly one."""
        found = self.owners(members)
        if sorted(found) != list(range(partitions)) or any(len(o) != 1 for o in found.values()):
            return None
        return {p: owners[0] for p, owners in found.items()}

    def agreed(self, members: Collection[int], partitions: int) -> bool:
        """Every partition has exactly one owner among ``members``, and each of them sees it."""
        owners = self.single_owners(members, partitions)
        return owners is not None and all(self.views.get(m) == owners for m in members)


@dataclass(frozen=True)
class Settled:
    """When a condition became true for the last time before the end of a replay (it held from
    then on), and how often it became false again before that (a flap)."""

    at: float
    flaps: int


def settled(
    timeline: Timeline, members: Collection[int], since: float, until: float, *, views: bool
) -> Settled | None:
    """When every partition got exactly one owner among ``members`` (and, with ``views``, every
    one of them agreed) for good, between ``since`` and ``until``; None if not so at ``until``."""
    state = State()
    held_since: float | None = None
    flaps = 0
    for index, report in timeline.ordered(until):
        state.apply(index, report)
        if report["t"] < since:
            continue
        now = (
            state.agreed(members, timeline.partitions)
            if views
            else state.single_owners(members, timeline.partitions) is not None
        )
        if now and held_since is None:
            held_since = report["t"]
        elif not now and held_since is not None:
            held_since, flaps = None, flaps + 1
    if held_since is None:
        state_now = state.agreed if views else state.single_owners
        if not state_now(members, timeline.partitions):
            return None
        held_since = since  # true already before ``since``
    return Settled(held_since, flaps)


def state_at(timeline: Timeline, at: float) -> State:
    state = State()
    for index, report in timeline.ordered(at):
        state.apply(index, report)
    return state


def moved_at(
    timeline: Timeline,
    partitions: Collection[int],
    to: Collection[int],
    since: float,
    until: float,
) -> float | None:
    """When each of ``partitions`` was owned by one of the members ``to`` (by their own
    reports), first after ``since``."""
    state = State()
    for index, report in timeline.ordered(until):
        state.apply(index, report)
        if report["t"] < since:
            continue
        others = state.owners(to)
        if all(p in others for p in partitions):
            return float(report["t"])
    return None


def stale_until(
    timeline: Timeline, member: int, members: Collection[int], since: float, until: float
) -> float | None:
    """When ``member`` (resumed at ``since``) last stopped claiming a partition another of
    ``members`` owned: the end of the window in which it could act on stale ownership."""
    state = State()
    end: float | None = None
    for index, report in timeline.ordered(until):
        state.apply(index, report)
        if report["t"] < since:
            continue
        others = state.owners(m for m in members if m != member)
        stale = any(p in others for p in state.owned.get(member, ()))
        if stale:
            end = None
        elif end is None:
            end = float(report["t"])
    return end


def writes(
    timeline: Timeline, members: Collection[int], since: float, until: float
) -> dict[str, int]:
    """Writes of ``members`` between ``since`` and ``until``, by who made them. A write is
    *stale* when another member claimed its partition later than the writer did. Counted:
    stale writes committed that began after that claim ("stale committed": two writers at
    once, unless the new owner had not opened its writer yet) or before it ("in flight at a
    handover": ordered before the new owner's writes, whose writer waits for them); stale
    writes refused as fenced ("stale refused"); refusals of the newest claimant's writes
    ("owner fenced": a stale member took the writer back); refusals of a write in flight when
    its member released the partition ("fenced after release"); any other failure."""
    counts = dict.fromkeys(
        (
            "stale committed",
            "stale refused",
            "in flight at a handover",
            "owner fenced",
            "fenced after release",
            "other",
        ),
        0,
    )
    state = State()
    for index, report in timeline.ordered(until):
        state.apply(index, report)
        if report["t"] < since or report["ev"] != "write" or index not in members:
            continue
        p, began = int(report["p"]), float(report["began"])
        mine = state.gained.get((index, p), float("-inf"))
        newer = [
            state.gained[m, p]
            for m in members
            if m != index and p in state.owned.get(m, ()) and state.gained[m, p] > mine
        ]
        fenced = not report["ok"] and str(report["err"]).removeprefix("init: ") in FENCED
        if newer and report["ok"]:
            stale = min(newer) < began
            counts["stale committed" if stale else "in flight at a handover"] += 1
        elif newer and fenced:
            counts["stale refused"] += 1
        elif fenced:
            owns = p in state.owned.get(index, ())
            counts["owner fenced" if owns else "fenced after release"] += 1
        elif not report["ok"]:
            counts["other"] += 1
    return counts


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """Median, smallest and largest of the values measured (None: not reached in time)."""
    listed = list(values)
    measured = sorted(v for v in listed if v is not None)
    missing = len(listed) - len(measured)
    if not measured:
        return {"median": None, "min": None, "max": None, "n": 0, "missing": missing}
    return {
        "median": statistics.median(measured),
        "min": measured[0],
        "max": measured[-1],
        "n": len(measured),
        "missing": missing,
    }
