"""Which version of each store answers its queries, and when an older version is retired.

Every declared version of a store is folded (:mod:`foldstream.projections.versions`). Queries of
the store are answered by the newest version that has been *live* for ``hold_s`` seconds in a
row: every partition of its source topic served by the owner the assignment names, its copy at
most ``ready_max_lag`` records behind and no further behind than its copy of the version
answering now (read from the members' states in the cluster map, so every member judges alike,
and a record that is not the named owner's, or that does not last, switches nothing). Until
then, the version this member answered with before (kept in the state directory across
restarts), else the oldest version not retired, answers. A member never goes back to an older
version.

An older version is retired once every live member has said for ``hold_s`` seconds that it
answers with a newer one (:mod:`.version_cleanup` does the retiring).

The figures are read by the request threads and the cluster's threads at once: they are
replaced whole, never changed in place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from foldstream.changelog import StoreLayout
from foldstream.cluster.assignment import Assignment
from foldstream.cluster.records import MemberState
from foldstream.cluster.version_cleanup import RetiredMarks
from foldstream.projections.versions import generation_of, logical_name, rank, version_of

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Under the state directory: the version each store answered with last, one file per store.
SERVING_DIR = "serving"


@dataclass(frozen=True)
class VersionState:
    """What ``GET /stores`` says of one version: ``state`` is ``serving``, ``building`` (newer
    than the one serving, not live yet), ``replaced`` (older, still folded until every member
    has switched) or ``retired``; of its source topic's offsets (``total``, summed over
    partitions), how many its active copies have ``folded`` and how many they are ``behind``
    (None: not known yet)."""

    version: int
    state: str
    folded: int | None
    behind: int | None
    total: int | None
    #: 0 for the version as first built, else the rebuild generation (:mod:`.rebuilds`).
    generation: int = 0


class VersionSwitch:
    """The versions of the stores of ``stores`` (physical name -> layout, every version
    declared and every rebuild generation, retired ones too), for a member whose state
    directory is ``state_dir``. A rebuild generation of a version (:mod:`.rebuilds`) is one
    more version, ranked after it and before the next (:func:`rank`); :meth:`add` adds one."""

    def __init__(
        self,
        *,
        stores: Mapping[str, StoreLayout],
        topics: Mapping[str, int],
        ready_max_lag: int,
        state_dir: Path,
        hold_s: float,
    ) -> None:
        self.topics = dict(topics)
        self.ready_max_lag = ready_max_lag
        self.hold_s = hold_s
        self.marks = RetiredMarks(Path(state_dir), stores)
        self._serving_dir = Path(state_dir) / SERVING_DIR
        self._source = {store: layout.source_topic for store, layout in stores.items()}
        versions: dict[str, list[tuple[tuple[int, int], str]]] = {}
        for store in stores:
            versions.setdefault(logical_name(store), []).append((rank(store), store))
        self.versions = {name: sorted(found) for name, found in versions.items()}
        self._serving = {name: self._first(name) for name in self.versions}
        self._since: dict[str, float] = {}  # a condition -> since when it has held
        self._progress: dict[str, tuple[int | None, int | None]] = {}
        self._lock = threading.Lock()  # one update at a time; readers read whole dicts

    # -- what requests ask -------------------------------------------------------------------

    def serving(self, store: str) -> str:
        """The physical store answering queries of ``store`` (a declared name); ``store``
        itself for a name that is no declared store's."""
        return self._serving.get(store, store)

    def counts(self, store: str) -> bool:
        """Whether ``store``'s lag and failures count for readiness and routing: it answers
        queries (the other versions are being built or replaced)."""
        return self._serving.get(logical_name(store), store) == store

    def counted(self, stores: Mapping[str, T]) -> dict[str, T]:
        """The entries of ``stores`` whose lag counts (:meth:`counts`)."""
        return {store: value for store, value in stores.items() if self.counts(store)}

    def add(self, store: str, source_topic: str) -> None:
        """Add ``store``, a rebuild generation of a version of a store with versions here."""
        with self._lock:
            name = logical_name(store)
            found = self.versions.get(name, [])
            if any(s == store for _, s in found):
                return
            self._source = {**self._source, store: source_topic}
            self.versions = {**self.versions, name: sorted([*found, (rank(store), store)])}
            if name not in self._serving:
                self._serving = {**self._serving, name: store}

    def is_retired(self, store: str) -> bool:
        return self.marks.is_retired(store)

    def retired(self) -> frozenset[str]:
        return self.marks.retired()

    def published(self) -> tuple[dict[str, int], dict[str, int]]:
        """``{store: version answering}`` of the stores with versions, and ``{store:
        generation}`` of those answering with a rebuild generation, for this member's state."""
        shown = {
            name: serving
            for name, serving in self._serving.items()
            if len(self.versions[name]) > 1 or rank(serving) > (1, 0)
        }
        return (
            {name: version_of(serving) for name, serving in shown.items()},
            {name: generation_of(s) for name, s in shown.items() if generation_of(s)},
        )

    def describe(self, store: str) -> list[VersionState]:
        """Every version of ``store`` (a declared name), oldest first."""
        serving = rank(self._serving.get(store, store))
        states = []
        for (version, generation), physical in self.versions.get(store, []):
            if self.is_retired(physical):
                state = "retired"
            elif (version, generation) == serving:
                state = "serving"
            else:
                state = "building" if (version, generation) > serving else "replaced"
            behind, total = self._progress.get(physical, (None, None))
            folded = None if behind is None or total is None else max(total - behind, 0)
            states.append(VersionState(version, state, folded, behind, total, generation))
        return states

    # -- following the cluster ---------------------------------------------------------------

    def update(
        self,
        members: Mapping[str, MemberState],
        assignment: Assignment,
        ends: Mapping[str, Mapping[int, int]] | None = None,
    ) -> list[str]:
        """Switch to the newest version live for :attr:`hold_s` (never back); with ``ends``
        (each source topic's end offsets) also measure each version's progress. Returns the
        older versions every live member has answered without for :attr:`hold_s`: due to be
        retired (:class:`~foldstream.cluster.version_cleanup.Retirement`)."""
        now = time.monotonic()
        with self._lock:
            serving, due = dict(self._serving), []
            holding: dict[str, float] = {}
            for name, found in self.versions.items():
                current = serving[name]
                live = [
                    s
                    for v, s in found
                    if v > rank(current)
                    and self._held(holding, s, now, self._live(s, current, members, assignment))
                ]
                if live:
                    serving[name] = live[-1]
                    self._keep(name, live[-1])
                now_serving = rank(serving[name])
                everyone = len(found) > 1 and all(
                    (m.serving.get(name, 0), m.generations.get(name, 0)) >= now_serving
                    for m in members.values()
                )
                if self._held(holding, f"{name} retires", now, everyone):
                    due += [s for v, s in found if v < now_serving and not self.is_retired(s)]
            self._serving, self._since = serving, holding
            if ends is not None:
                self._progress = {
                    s: self._measure(s, members, assignment, ends.get(self._source[s]))
                    for found in self.versions.values()
                    if len(found) > 1
                    for _, s in found
                }
            return due

    def _held(self, holding: dict[str, float], condition: str, now: float, true: bool) -> bool:
        """Whether ``condition`` has been true for :attr:`hold_s` (``holding`` keeps when each
        true one became true; a false one is dropped)."""
        if not true:
            return False
        since = holding[condition] = self._since.get(condition, now)
        return now - since >= self.hold_s

    def _first(self, name: str) -> str:
        """The version ``name`` answers with before the cluster says more: the one this
        member answered with last, else the oldest not retired."""
        found = dict(self.versions[name])
        kept = [s for _, s in sorted(found.items()) if not self.is_retired(s)]
        try:
            version, _, generation = (self._serving_dir / name).read_text().partition(".")
            before = found.get((int(version), int(generation or 0)))
        except (OSError, ValueError):
            before = None
        if before is not None and before in kept:
            return before
        return kept[0] if kept else self.versions[name][-1][1]

    def _keep(self, name: str, store: str) -> None:
        log.info("store %s now answers with %s", name, store)
        self._serving_dir.mkdir(parents=True, exist_ok=True)
        path = self._serving_dir / name
        version, generation = rank(store)
        # "N" for a version as first built (what earlier releases read), "N.G" for a rebuild.
        path.with_suffix(".new").write_text(
            f"{version}.{generation}" if generation else str(version)
        )
        path.with_suffix(".new").replace(path)

    def _owner(
        self, members: Mapping[str, MemberState], assignment: Assignment, topic: str, p: int
    ) -> MemberState | None:
        """The member the assignment names for ``p``, when it serves it (no other record
        counts)."""
        owner = members.get(assignment.owner(topic, p) or "")
        return owner if owner is not None and p in owner.active.get(topic, ()) else None

    def _live(
        self,
        store: str,
        current: str,
        members: Mapping[str, MemberState],
        assignment: Assignment,
    ) -> bool:
        """Whether every partition of ``store`` is served by its named owner, caught up, and
        no further behind than its copy of the version answering now (``current``): the
        switch never answers with older state than before it."""
        if self.is_retired(store):
            return False
        topic = self._source[store]
        for p in range(self.topics.get(topic, 0)):
            owner = self._owner(members, assignment, topic, p)
            lag = None if owner is None else owner.lag.get(f"{store}/{p}")
            if owner is None or lag is None or lag > self.ready_max_lag:
                return False
            before = owner.lag.get(f"{current}/{p}")
            if before is not None and self._source[current] == topic and lag > before:
                return False
        return True

    def _measure(
        self,
        store: str,
        members: Mapping[str, MemberState],
        assignment: Assignment,
        ends: Mapping[int, int] | None,
    ) -> tuple[int | None, int | None]:
        topic = self._source[store]
        lags = []
        for p in range(self.topics.get(topic, 0)):
            owner = self._owner(members, assignment, topic, p)
            lags.append(None if owner is None else owner.lag.get(f"{store}/{p}"))
        behind = None if any(lag is None for lag in lags) else sum(lag or 0 for lag in lags)
        total = None if ends is None else sum(ends.values())
        return behind, total
