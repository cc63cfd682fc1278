"""Partitioned key-value state: interfaces in :mod:`.base`, RocksDB in :mod:`.rocksdb`."""

from __future__ import annotations

from foldstream.state.base import PartitionReader, PartitionWriter
from foldstream.state.rocksdb import (
    RocksDBReader,
    RocksDBWriter,
    discard_partition,
    partition_path,
)

__all__ = [
    "PartitionReader",
    "PartitionWriter",
    "RocksDBReader",
    "RocksDBWriter",
    "discard_partition",
    "partition_path",
]
