"""What the query API reads: every store's partitions, routed by key like the producer routes.

The query API never holds, releases or writes a partition: it reads through :class:`StoreReaders`,
a read-only view of this instance's :class:`~foldstream.state.local.LocalStores`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from foldstream.cluster.versions import VersionState, VersionSwitch
from foldstream.errors import StoreNotFound
from foldstream.kafka import Partitioner, partition_for
from foldstream.projections import Projection, WindowedAggregate
from foldstream.projections.ordered import OrderedProjection
from foldstream.projections.projection import StoreKind
from foldstream.projections.versions import logical_name, rank, version_of
from foldstream.state.applied import AppliedOffsets
from foldstream.state.base import Entries
from foldstream.state.format import ORDERED_FORMAT, TABLE_FORMAT
from foldstream.state.local import LocalStores
from foldstream.state.ordered_keys import SortKeyType


@dataclass(frozen=True)
class StoreInfo:
    """A store's source ``topic``, its partition count and the producer's partitioner; its
    ``kind`` (what it answers), and for an ordered store its ``sort_key`` type, for a windowed
    one its windows' size and retention (milliseconds)."""

    topic: str
    partitions: int
    partitioner: Partitioner
    kind: StoreKind = "point"
    sort_key: SortKeyType | None = None
    window_ms: int | None = None
    retention_ms: int | None = None

    @classmethod
    def of(cls, projection: Projection, topic: str, partitions: int) -> StoreInfo:
        """The info of ``projection``'s store, whose source ``topic`` has ``partitions``."""
        info = cls(
            topic, partitions, projection.partitioner, projection.kind, sort_key_of(projection)
        )
        if isinstance(projection, WindowedAggregate):
            return replace(info, window_ms=projection.size_ms, retention_ms=projection.retention_ms)
        return info

    def partition_of(self, key: bytes) -> int:
        """The partition of the store's source topic that holds ``key``, as its producer puts it."""
        return partition_for(key, self.partitions, self.partitioner)

    @property
    def table_format(self) -> str:
        """The on-disk format of the store's partitions."""
        return TABLE_FORMAT if self.kind == "point" else ORDERED_FORMAT


def sort_key_of(projection: Projection) -> SortKeyType | None:
    """The type of the sort keys ``projection``'s store reads by: an ordered store's own, times
    for a windowed store's windows, none for a point store."""
    if isinstance(projection, OrderedProjection):
        return projection.sort_key
    return "time" if isinstance(projection, WindowedAggregate) else None


class StoreReaders:
    """Read access to the partitions of ``stores`` that ``local`` has (active or standby);
    ``applied`` is where the writers of those copies say what they applied (None: a wait for
    an offset only checks the copy once).

    ``stores`` holds every version of a store (:mod:`foldstream.projections.versions`) known
    at the start;
    requests name a store as declared, and :meth:`serving` says which version answers them
    (``versions``; without, version 1 or the only one declared)."""

    def __init__(
        self,
        stores: Mapping[str, StoreInfo],
        local: LocalStores,
        *,
        applied: AppliedOffsets | None = None,
        versions: VersionSwitch | None = None,
    ) -> None:
        self.layout = dict(stores)
        self._local = local
        self._applied = applied
        self._versions = versions
        #: The declared store names, in the service's order, each with its oldest version here.
        self.names: dict[str, str] = {}
        for store in self.layout:
            oldest = self.names.get(logical_name(store))
            if oldest is None or rank(store) < rank(oldest):
                self.names[logical_name(store)] = store

    @classmethod
    def at(cls, state_dir: Path, stores: Mapping[str, StoreInfo]) -> StoreReaders:
        """Readers of the store partitions under ``state_dir`` as written by other processes
        (read-only snapshots, for tools and tests); :meth:`close` closes them."""
        formats = {name: info.table_format for name, info in stores.items()}
        return cls(stores, LocalStores(state_dir, formats=formats))

    def close(self) -> None:
        """Close the snapshots this view opened (an instance closes its stores itself)."""
        self._local.close()

    def serving(self, store: str) -> str:
        """The version of ``store`` (a declared name) that answers its queries now;
        :class:`StoreNotFound` when no store has that name."""
        oldest = self.names.get(store)
        if oldest is None:
            raise StoreNotFound(f"no store named {store!r}; stores: {sorted(self.names)}")
        return oldest if self._versions is None else self._versions.serving(store)

    def retired(self, version: str) -> bool:
        """Whether ``version`` (a store version :meth:`serving` named) has been retired since:
        its copies are gone."""
        return self._versions is not None and self._versions.is_retired(version)

    def versions(self, store: str) -> list[VersionState]:
        """Each version of ``store`` (a declared name): its state and progress."""
        if self._versions is None:
            return [VersionState(version_of(self.serving(store)), "serving", None, None, None)]
        return self._versions.describe(store)

    def info(self, store: str) -> StoreInfo:
        """The info of ``store``, a version :meth:`serving` named (a rebuild generation added
        since the start has the info of the store's other versions: all alike)."""
        try:
            return self.layout.get(store) or self.layout[self.names[logical_name(store)]]
        except KeyError:
            raise StoreNotFound(f"no store named {store!r}; stores: {sorted(self.names)}") from None

    def get(self, store: str, partition: int, key: bytes, *, standby: bool = False) -> bytes | None:
        """``key`` from this instance's active (or, with ``standby``, standby) copy."""
        return self._local.get(store, partition, key, standby=standby)

    def get_many(
        self, store: str, partition: int, keys: list[bytes], *, standby: bool = False
    ) -> list[bytes | None]:
        """Values of ``keys`` (all of ``partition``) from one copy."""
        return self._local.get_many(store, partition, keys, standby=standby)

    def has_applied(self, store: str, partition: int, offset: int, *, standby: bool) -> bool:
        """Whether this instance's active (or standby) copy reflects source ``offset``."""
        try:
            applied = self._local.applied_offset(store, partition, standby=standby)
        except Exception:  # noqa: BLE001 - the copy is gone (released meanwhile): not yet
            return False
        return applied is not None and applied >= offset

    async def wait_applied(
        self, store: str, partition: int, offset: int, timeout: float, *, standby: bool
    ) -> bool:
        """Wait up to ``timeout`` seconds until the copy reflects source ``offset``; whether
        it does."""

        def reached() -> bool:
            return self.has_applied(store, partition, offset, standby=standby)

        if self._applied is None or timeout <= 0:
            return reached()
        return await self._applied.wait(store, partition, offset, timeout, reached)

    def scan(
        self,
        store: str,
        partition: int,
        start: bytes,
        end: bytes,
        limit: int,
        *,
        standby: bool = False,
    ) -> Entries:
        """Up to ``limit`` entries of ``[start, end)`` from one copy, in key order."""
        return self._local.scan(store, partition, start, end, limit, standby=standby)
