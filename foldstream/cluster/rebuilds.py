"""Rebuilding the version of a store that answers, on demand, beside itself.

``POST /stores/{store}/rebuilds`` (``foldstream rebuild URL STORE``) asks for it: the instance
asked publishes a :class:`~foldstream.cluster.records.RebuildRequest` (the store, the version
answering, the next generation) in the compacted cluster topic, so every member reads it,
those that start later included. Each member then adds the generation as one more physical
store, ``<store>.vN.rG`` (:func:`~foldstream.projections.versions.generation_name`): it creates
its changelog and dead-letter topics (idempotent), starts its query, holds its copies of the
partitions it serves and folds them from the source's first offset; takeovers and standby
copies include it from then on (:class:`~foldstream.changelog.StoreCatalog`). The version
switch (:mod:`.versions`) ranks it after the version it rebuilds: queries switch to it once
it is live, and the generation it replaces is retired, as for a new version.

A file under the state directory's ``rebuilds/`` folder keeps the generation across restarts
(:func:`rebuilt_stores`). A request is untrusted input: one naming no store this member
declares, a version it does not declare, or a store that cannot be rebuilt, does nothing
here and is counted as invalid; one for a generation retired here is not built again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from foldstream.changelog import StoreCatalog, StoreLayout
from foldstream.cluster.map import ClusterMap
from foldstream.cluster.records import RebuildRequest
from foldstream.cluster.versions import VersionSwitch
from foldstream.errors import FoldstreamError, StoreNotFound
from foldstream.projections.versions import (
    MAX_GENERATION,
    generation_name,
    generation_of,
    logical_name,
    rank,
    version_of,
)

log = logging.getLogger(__name__)

#: Under the state directory: one empty file per rebuild generation this member added.
REBUILDS_DIR = "rebuilds"
#: How long after a failure to add a generation (its topics, its query) it is tried again.
RETRY_S = 10.0


class RebuildRefused(FoldstreamError):
    """The store cannot be rebuilt beside itself (the message names the remedy)."""


class RebuildConflict(FoldstreamError):
    """A newer version or a rebuild of the store is being built already.

    Remedy: follow it with ``foldstream versions URL STORE`` and ask again once it answers.
    """


class Generations(Protocol):
    """What a member needs of its service to add a generation
    (:class:`foldstream.generations.ServiceGenerations`)."""

    def refusal(self, store: str) -> str | None:
        """Why ``store`` (a physical name) cannot be rebuilt (None: it can)."""

    def prepare(self, store: str) -> StoreLayout:
        """Create the topics of generation ``store`` and start its query; its layout."""


def rebuilt_stores(state_dir: Path) -> frozenset[str]:
    """The rebuild generations added in ``state_dir`` (by this run or one before)."""
    marked = Path(state_dir) / REBUILDS_DIR
    if not marked.is_dir():
        return frozenset()
    return frozenset(p.name for p in marked.iterdir() if generation_of(p.name) > 0)


class Rebuilds:
    """Requests rebuilds (:meth:`request`) and adds the generations requested
    (:meth:`follow`, from the member's store-versions thread); ``hold_added`` holds the copies
    of added stores on the partitions served here
    (:meth:`~foldstream.cluster.handover.Handover.hold_added`)."""

    def __init__(
        self,
        *,
        state_dir: Path,
        catalog: StoreCatalog,
        versions: VersionSwitch,
        hold_added: Callable[[], object],
        cluster_map: ClusterMap,
        generations: Generations | None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.catalog = catalog
        self.versions = versions
        self.hold_added = hold_added
        self.map = cluster_map
        self.generations = generations
        self.invalid = 0  # requests ignored as invalid
        self._done: set[RebuildRequest] = set()
        self._retry_at: dict[RebuildRequest, float] = {}  # failed to add: tried again then

    def request(self, store: str) -> RebuildRequest:
        """Ask every member to rebuild the version of ``store`` (a declared name) that answers
        here. :class:`StoreNotFound`, :class:`RebuildRefused` or :class:`RebuildConflict`."""
        found = self.versions.versions.get(store)
        if found is None or self.generations is None:
            raise StoreNotFound(
                f"no store named {store!r}; stores: {sorted(self.versions.versions)}"
            )
        self._check_not_building(store)
        serving = self.versions.serving(store)
        reason = self.generations.refusal(serving)
        if reason is not None:
            raise RebuildRefused(reason)
        version = version_of(serving)
        known = [generation_of(s) for _, s in found if version_of(s) == version]
        asked = self.map.rebuilds().get(store)
        if asked is not None and asked.version == version:
            known.append(asked.generation)
        generation = max(known) + 1
        if generation > MAX_GENERATION:
            raise RebuildRefused(
                f"version {version} of store {store!r} was rebuilt {MAX_GENERATION} times: "
                "declare its fold as the next version instead"
            )
        request = RebuildRequest(store=store, version=version, generation=generation)
        self.map.request_rebuild(request)
        log.info("rebuild of %s requested", generation_name(store, version, generation))
        return request

    def _check_not_building(self, store: str) -> None:
        """:class:`RebuildConflict` while a newer version of ``store`` is built, or while a
        rebuild of the version answering was asked for and is not listed here yet."""
        serving = self.versions.serving(store)
        building = [v.version for v in self.versions.describe(store) if v.state == "building"]
        asked = self.map.rebuilds().get(store)
        if asked is not None:
            name = generation_name(store, asked.version, asked.generation)
            if (
                asked.version == version_of(serving)
                and rank(name) > rank(serving)
                and not self.versions.marks.is_marked(name)
            ):
                building.append(asked.version)
        if building:
            raise RebuildConflict(
                f"store {store!r} is building version {building[-1]} already: follow it with "
                "`foldstream versions URL STORE` and ask again once it answers"
            )

    def follow(self) -> None:
        """Add each generation requested and not added yet, and hold the copies of added ones
        on the partitions served here."""
        now = time.monotonic()
        for request in self.map.rebuilds().values():
            if request in self._done or self._retry_at.get(request, 0.0) > now:
                continue
            try:
                name = self.wanted(request)
                if name is not None:
                    self._add(name)
            except (RebuildRefused, StoreNotFound) as exc:
                self.invalid += 1
                log.warning("ignoring a request to rebuild %s: %s", request.store, exc)
            except Exception:  # noqa: BLE001 - e.g. its topics not created: tried again
                self._retry_at[request] = now + RETRY_S
                log.exception(
                    "adding a rebuild of %s failed; trying again in %.0fs", request.store, RETRY_S
                )
                continue
            self._done.add(request)
        self.hold_added()

    def wanted(self, request: RebuildRequest) -> str | None:
        """The generation ``request`` asks this member to add; None when there is nothing to
        add (added already, retired, or superseded here by a newer version or generation);
        :class:`StoreNotFound` or :class:`RebuildRefused` for a request no member should
        have published (a version not declared here, a store that cannot be rebuilt)."""
        store, version = request.store, request.version
        name = generation_name(store, version, request.generation)
        base = generation_name(store, version, 0)
        if base not in self.catalog:
            raise StoreNotFound(f"version {version} of store {store!r} is not declared here")
        if self.generations is None:
            raise RebuildRefused("this member adds no stores")
        reason = self.generations.refusal(base)
        if reason is not None:
            raise RebuildRefused(reason)
        if name in self.catalog or self.versions.marks.is_marked(name):
            return None  # added already, or retired since: never built again
        serving = self.versions.serving(logical_name(base))
        if rank(name) <= rank(serving) or self.versions.is_retired(base):
            return None
        return name

    def _add(self, name: str) -> None:
        assert self.generations is not None  # checked by wanted()
        layout = self.generations.prepare(name)
        marker = self.state_dir / REBUILDS_DIR / name
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        self.versions.add(name, layout.source_topic)
        self.catalog.add(name, layout)
        log.info("rebuild generation %s added: folding it from the source's first offset", name)
