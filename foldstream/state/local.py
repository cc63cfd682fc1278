"""This instance's copies of store partitions: the ones it holds open as their writer (through
the store host), read-only snapshots of the others under its state directory, and standby
copies kept from changelogs.

Holding a partition (:meth:`LocalStores.hold`) is what the cluster does when the instance takes
it over; reading (:meth:`LocalStores.get` and friends) is what the query API does. The query API
reads through a read-only view of this class (``foldstream.query_api.stores.StoreReaders``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from foldstream.state.base import Entries, PartitionReader
from foldstream.state.format import TABLE_FORMAT
from foldstream.state.host import PartitionClosed, StoreHost
from foldstream.state.rocksdb import RocksDBReader, partition_path

T = TypeVar("T")
StoreKey = tuple[str, int]
"""``(store, partition)``."""
StandbyRead = Callable[[str, int, bytes], "bytes | None"]
StandbyOffset = Callable[[str, int], "int | None"]
StandbyScan = Callable[[str, int, bytes, bytes, int], Entries]
#: How long a snapshot of a released partition stays open: a lookup may still be reading it.
RETIRED_SNAPSHOT_S = 5.0


class LocalStores:
    """The store partitions under ``state_dir``: those ``host`` holds open (this instance
    writes them), read-only snapshots of any other (opened on first use, closed some seconds
    after :meth:`release`), and ``standby_read`` / ``standby_scan`` for copies kept from
    changelogs (and ``standby_offset``, the source offset each reflects). ``formats`` names the
    format of each store not kept as point stores are. Snapshots read point stores through
    ``mmap``: they serve the queryable stores, never the aggregate store (read unmapped)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        host: StoreHost | None = None,
        standby_read: StandbyRead | None = None,
        standby_offset: StandbyOffset | None = None,
        standby_scan: StandbyScan | None = None,
        formats: Mapping[str, str] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self._host = host
        self._standby_read = standby_read
        self._standby_offset = standby_offset
        self._standby_scan = standby_scan
        self._formats = formats if formats is not None else {}  # may gain stores: not copied
        self._readers: dict[StoreKey, RocksDBReader] = {}
        self._retired: list[tuple[float, RocksDBReader]] = []
        self._lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------------

    def get(self, store: str, partition: int, key: bytes, *, standby: bool = False) -> bytes | None:
        """``key`` from this instance's active (or, with ``standby``, standby) copy."""
        if standby:
            if self._standby_read is None:
                raise KeyError(f"no standby copies of {store}")
            return self._standby_read(store, partition, key)
        # _active's steps, written out: this is every lookup's path.
        held = self._host.partition(store, partition) if self._host is not None else None
        if held is not None:
            try:
                return held.get(key)
            except PartitionClosed:
                pass  # closed under this read: the snapshot has its last state
        return self._snapshot(store, partition).get(key)

    def get_many(
        self, store: str, partition: int, keys: list[bytes], *, standby: bool = False
    ) -> list[bytes | None]:
        """Values of ``keys`` (all of ``partition``) from one copy."""
        if standby:
            return [self.get(store, partition, key, standby=True) for key in keys]
        return self._active(store, partition, lambda reader: reader.get_many(keys))

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
        if standby:
            if self._standby_scan is None:
                raise KeyError(f"no standby copies of {store}")
            return self._standby_scan(store, partition, start, end, limit)
        return self._active(store, partition, lambda reader: reader.scan(start, end, limit))

    def next_offset(self, store: str, partition: int) -> int:
        """The first source offset not yet in the active copy, freshly read."""
        return self._active(store, partition, _fresh_next_offset)

    def applied_offset(self, store: str, partition: int, *, standby: bool = False) -> int | None:
        """The last source offset this instance's active (or standby) copy reflects."""
        if standby:
            if self._standby_offset is None:
                raise KeyError(f"no standby copies of {store}")
            return self._standby_offset(store, partition)
        return self._active(store, partition, _fresh_applied_offset)

    def _active(self, store: str, partition: int, read: Callable[[PartitionReader], T]) -> T:
        """``read`` applied to the partition ``host`` holds, else to a snapshot of it."""
        held = self._host.partition(store, partition) if self._host is not None else None
        if held is not None:
            try:
                return read(held)
            except PartitionClosed:
                pass  # closed under this read: the snapshot has its last state
        return read(self._snapshot(store, partition))

    def _snapshot(self, store: str, partition: int) -> RocksDBReader:
        reader = self._readers.get((store, partition))
        if reader is None:
            with self._lock:
                reader = self._readers.get((store, partition))
                if reader is None:
                    reader = RocksDBReader(
                        partition_path(self.state_dir, store, partition),
                        table_format=self._formats.get(store, TABLE_FORMAT),
                    )
                    self._readers[(store, partition)] = reader
        return reader

    # -- holding -----------------------------------------------------------------------------

    def hold(self, store: str, partition: int, *, identity: str, epoch: int) -> int:
        """Have the store host hold the partition open: this instance writes and serves it now.
        Returns the epoch its changelog records carry (see :meth:`StoreHost.open`)."""
        if self._host is None:
            return epoch
        return self._host.open(store, partition, identity=identity, epoch=epoch)

    def holds(self, store: str, partition: int) -> bool:
        return self._host is not None and self._host.partition(store, partition) is not None

    def held(self) -> frozenset[StoreKey]:
        return self._host.held() if self._host is not None else frozenset()

    def release(self, partitions: Iterable[StoreKey]) -> None:
        """Stop holding and reading ``(store, partition)`` pairs this instance no longer writes.
        Their snapshots are closed a few seconds later: a lookup may still be reading one."""
        partitions = list(partitions)
        if self._host is not None:
            self._host.close(partitions)
        now = time.monotonic()
        with self._lock:
            for key in partitions:
                reader = self._readers.pop(key, None)
                if reader is not None:
                    self._retired.append((now, reader))
            keep = []
            for retired_at, reader in self._retired:
                if now - retired_at > RETIRED_SNAPSHOT_S:
                    reader.close()
                else:
                    keep.append((retired_at, reader))
            self._retired = keep

    def close(self) -> None:
        with self._lock:
            for reader in [*self._readers.values(), *(r for _, r in self._retired)]:
                reader.close()
            self._readers.clear()
            self._retired.clear()


def _fresh_next_offset(reader: PartitionReader) -> int:
    reader.refresh()
    return reader.next_offset()


def _fresh_applied_offset(reader: PartitionReader) -> int | None:
    reader.refresh()
    return reader.applied_offset()
