"""Which version of each store answers its queries, and when an older version is retired.

Every declared version of a store is folded (:mod:`foldstream.projections.versions`). Queries of
the store are answered by the newest version that is *live*: every partition of its source topic
is served by a live member whose copy is at most ``ready_max_lag`` records behind (read from the
members' states in the cluster map, so every member judges alike). Until one is live, the oldest
version not retired answers, as before the new one was declared. Once a member answers with a
version it never goes back to an older one.

An older version is retired once every live member says (in its state) that it answers with a
newer one: its query stops, its copies are released and their directories deleted, and a marker
file in the state directory keeps it retired across restarts (its topics are not even created
again). The leader deletes its changelog and dead-letter topics once every live member lists it
as retired.

Everything here is read by the request threads and the cluster's threads at once: the figures
are replaced whole, never changed in place.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from foldstream.changelog import StoreLayout
from foldstream.cluster.records import MemberState
from foldstream.kafka_client import admin_client
from foldstream.kafka_topics import topic_partitions
from foldstream.projections.versions import logical_name, version_of
from foldstream.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Under the state directory: one empty file per retired store version.
RETIRED_DIR = "retired"
#: How often the leader looks for topics of retired versions (a member started with an empty
#: state directory creates them again before it learns they are retired).
TOPICS_CHECK_S = 60.0


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


class VersionSwitch:
    """The versions of the stores of ``stores`` (physical name -> layout), for a member whose
    state directory is ``state_dir``."""

    def __init__(
        self,
        *,
        stores: Mapping[str, StoreLayout],
        topics: Mapping[str, int],
        ready_max_lag: int,
        state_dir: Path,
    ) -> None:
        self.topics = dict(topics)
        self.ready_max_lag = ready_max_lag
        self.state_dir = Path(state_dir)
        self._source = {store: layout.source_topic for store, layout in stores.items()}
        versions: dict[str, list[tuple[int, str]]] = {}
        for store in stores:
            versions.setdefault(logical_name(store), []).append((version_of(store), store))
        self.versions = {name: sorted(found) for name, found in versions.items()}
        self._retired = frozenset(s for s in retired_stores(self.state_dir) if s in stores)
        self._serving = {name: self._fallback(name) for name in self.versions}
        self._progress: dict[str, tuple[int | None, int | None]] = {}
        self._lock = threading.Lock()  # one update at a time; readers read whole dicts

    # -- what requests ask -------------------------------------------------------------------

    def serving(self, store: str) -> str:
        """The physical store answering queries of ``store`` (a declared name); ``store``
        itself for a name that is no declared store's."""
        return self._serving.get(store, store)

    def counts(self, store: str) -> bool:
        """Whether ``store``'s lag counts for readiness and routing: it answers queries (the
        other versions are being built or replaced)."""
        return self._serving.get(logical_name(store), store) == store

    def counted(self, stores: Mapping[str, T]) -> dict[str, T]:
        """The entries of ``stores`` whose lag counts (:meth:`counts`)."""
        return {store: value for store, value in stores.items() if self.counts(store)}

    def is_retired(self, store: str) -> bool:
        return store in self._retired

    def retired(self) -> frozenset[str]:
        return self._retired

    def published(self) -> dict[str, int]:
        """``{store: version answering}`` of the stores with several versions, for this
        member's state."""
        return {
            name: version_of(self._serving[name])
            for name, found in self.versions.items()
            if len(found) > 1
        }

    def describe(self, store: str) -> list[VersionState]:
        """Every version of ``store`` (a declared name), oldest first."""
        serving = version_of(self._serving.get(store, store))
        states = []
        for version, physical in self.versions.get(store, []):
            if physical in self._retired:
                state = "retired"
            elif version == serving:
                state = "serving"
            else:
                state = "building" if version > serving else "replaced"
            behind, total = self._progress.get(physical, (None, None))
            folded = None if behind is None or total is None else max(total - behind, 0)
            states.append(VersionState(version, state, folded, behind, total))
        return states

    # -- following the cluster ---------------------------------------------------------------

    def update(
        self,
        members: Mapping[str, MemberState],
        ends: Mapping[str, Mapping[int, int]] | None = None,
    ) -> list[str]:
        """Switch to the newest live version of each store (never back); with ``ends`` (each
        source topic's end offsets) also measure each version's progress. Returns the older
        versions every live member has switched away from: due for :meth:`retire`."""
        with self._lock:
            serving = dict(self._serving)
            due = []
            for name, found in self.versions.items():
                current = version_of(serving[name])
                live = [
                    v for v, s in found if v > current and self._live(s, serving[name], members)
                ]
                if live:
                    serving[name] = dict(found)[max(live)]
                    log.info("store %s now answers with %s", name, serving[name])
                now = version_of(serving[name])
                if len(found) > 1 and all(m.serving.get(name, 0) >= now for m in members.values()):
                    due += [s for v, s in found if v < now and s not in self._retired]
            self._serving = serving
            if ends is not None:
                self._progress = {
                    store: self._measure(store, members, ends.get(self._source[store]))
                    for found in self.versions.values()
                    if len(found) > 1
                    for _, store in found
                }
            return due

    def _fallback(self, name: str) -> str:
        kept = [s for _, s in self.versions[name] if s not in self._retired]
        return kept[0] if kept else self.versions[name][-1][1]

    def _live(self, store: str, current: str, members: Mapping[str, MemberState]) -> bool:
        """Whether every partition of ``store`` is served by a live member whose copy is
        caught up, and no further behind than its copy of the version answering now
        (``current``): the switch never answers with older state than before it."""
        if store in self._retired:
            return False
        topic = self._source[store]

        def caught_up(member: MemberState, partition: int) -> bool:
            if partition not in member.active.get(topic, ()):
                return False
            lag = member.lag.get(f"{store}/{partition}")
            if lag is None or lag > self.ready_max_lag:
                return False
            before = member.lag.get(f"{current}/{partition}")
            return before is None or self._source[current] != topic or lag <= before

        return all(
            any(caught_up(m, p) for m in members.values()) for p in range(self.topics.get(topic, 0))
        )

    def _measure(
        self, store: str, members: Mapping[str, MemberState], ends: Mapping[int, int] | None
    ) -> tuple[int | None, int | None]:
        topic = self._source[store]
        lags = [
            next(
                (
                    m.lag.get(f"{store}/{p}")
                    for m in members.values()
                    if p in m.active.get(topic, ())
                ),
                None,
            )
            for p in range(self.topics.get(topic, 0))
        ]
        behind = None if any(lag is None for lag in lags) else sum(lag or 0 for lag in lags)
        total = None if ends is None else sum(ends.values())
        return behind, total

    # -- retiring ----------------------------------------------------------------------------

    def retire(self, store: str) -> None:
        """Mark ``store`` (an older version) retired, here and in the state directory."""
        marker = self.state_dir / RETIRED_DIR / store
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        with self._lock:
            self._retired = self._retired | {store}
        log.info("store version %s retired: its copies and directories go", store)

    def delete_directories(self, held: frozenset[tuple[str, int]]) -> None:
        """Delete the state of every retired store of which no copy is ``held`` (a copy still
        open is left for the next call)."""
        for store in self._retired:
            path = self.state_dir / "stores" / store
            if path.exists() and not any(s == store for s, _ in held):
                shutil.rmtree(path, ignore_errors=True)
                log.info("deleted the state of retired store version %s", store)


def retired_stores(state_dir: Path) -> frozenset[str]:
    """The store versions retired in ``state_dir`` (by a run before this one)."""
    marked = Path(state_dir) / RETIRED_DIR
    if not marked.is_dir():
        return frozenset()
    return frozenset(path.name for path in marked.iterdir())


class RetiredTopics:
    """The leader's part: deleting the changelog and dead-letter topics of the store versions
    every live member has retired (with ``create_topics`` false, asking the operator to)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._next_check = 0.0

    def delete(self, members: Mapping[str, MemberState]) -> None:
        """Delete what is left of the retired versions' topics, once per :data:`TOPICS_CHECK_S`."""
        retired = (
            set.intersection(*(set(m.retired) for m in members.values())) if members else set()
        )
        now = time.monotonic()
        if not retired or now < self._next_check:
            return
        self._next_check = now + TOPICS_CHECK_S
        settings = self.settings
        admin = admin_client(settings.bootstrap_servers)  # held until the futures are done
        topics = [
            topic
            for store in sorted(retired)
            for topic in (settings.changelog_topic(store), settings.dead_letter_topic(store))
            if topic_partitions(admin, topic) is not None
        ]
        if not topics:
            return
        if not settings.create_topics:
            log.warning(
                "the topics %s belong to retired store versions: delete them (this instance "
                "creates and deletes no topics: create_topics is false)",
                topics,
            )
            return
        for topic, future in admin.delete_topics(topics, operation_timeout=10).items():
            try:
                future.result(timeout=15)
                log.info("deleted topic %s of a retired store version", topic)
            except Exception as exc:  # noqa: BLE001 - tried again at the next check
                log.warning(
                    "deleting topic %s of a retired store version failed (%s); trying again "
                    "in %.0fs (check that the instance's Kafka principal may delete it)",
                    topic,
                    exc,
                    TOPICS_CHECK_S,
                )
