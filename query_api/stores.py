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

    def get_many(self, store: str, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in ``store`` (None where missing): one read per partition."""
        by_partition: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            by_partition.setdefault(self.partition(store, key), []).append(index)
        values: list[bytes | None] = [None] * len(keys)
        for partition, indexes in by_partition.items():
            found = self._readers[store][partition].get_many([keys[i] for i in indexes])
            for index, value in zip(indexes, found, strict=True):
                values[index] = value
        return values

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
