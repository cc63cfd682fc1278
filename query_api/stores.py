"""Read access to every partition of every store, routed by key like the producer routes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from foldstream.errors import StoreNotFound
from foldstream.kafka import Partitioner, partition_for
from foldstream.state import RocksDBReader, partition_path


class StoreReaders:
    """Open readers of ``stores`` (``{store: (partitions, partitioner)}``) under ``state_dir``."""

    def __init__(self, state_dir: Path, stores: Mapping[str, tuple[int, Partitioner]]) -> None:
        self.layout = dict(stores)
        self._readers = {
            store: [RocksDBReader(partition_path(state_dir, store, p)) for p in range(count)]
            for store, (count, _) in self.layout.items()
        }

    def partition(self, store: str, key: bytes) -> int:
        try:
            count, partitioner = self.layout[store]
        except KeyError:
            raise StoreNotFound(
                f"no store named {store!r}; stores: {sorted(self.layout)}"
            ) from None
        return partition_for(key, count, partitioner)

    def get(self, store: str, key: bytes) -> bytes | None:
        partition = self.partition(store, key)
        return self._readers[store][partition].get(key)

    def next_offsets(self, store: str) -> dict[int, int]:
        """``{partition: first source offset not yet in the store}``, freshly read."""
        readers = self._readers[store]
        for reader in readers:
            reader.refresh()
        return {p: reader.next_offset() for p, reader in enumerate(readers)}

    def close(self) -> None:
        for readers in self._readers.values():
            for reader in readers:
                reader.close()
        self._readers.clear()
