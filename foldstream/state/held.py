"""A partition the store host holds open: read by lookups and tasks, written by tasks, closed
when the partition moves (see :mod:`foldstream.state.host`)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

from foldstream.errors import FoldstreamError
from foldstream.state.base import Entries, PartitionReader
from foldstream.state.rocksdb import RocksDBWriter

T = TypeVar("T")


class PartitionClosed(FoldstreamError):
    """The partition is not held open by this instance (it moved to another one).

    A projection task that planned it before it moved skips it; the new owner resumes from the
    offset stored with the state. Remedy: none, it ends when the rebalance does.
    """


#: Keys per RocksDB multi-get when a task reads: lookups on the event loop wait for the GIL
#: between chunks instead of for a whole rebuild batch.
READ_CHUNK = 4096


class HoldState(NamedTuple):
    """Where a held partition stands when a task reads it."""

    token: str  # the hold's: a write from a task that read an earlier hold is refused
    epoch: int  # stamped on every changelog record written from this hold
    applied_offset: int | None
    changelog_offset: int | None
    source_id: str | None = None  # the id of the source topic the state is built from


class HeldPartition(PartitionReader):
    """One open partition of a :class:`~foldstream.state.host.StoreHost`.

    Lookups read it while a task writes (RocksDB allows both). A task's read and its write
    exclude other tasks', and a write is refused unless the partition is still the one held
    when the task read it (:attr:`token`) at the offset it read: a task that outlived its
    partition's move cannot overwrite newer state. :meth:`close` waits for reads and writes
    under way. :attr:`epoch` and :attr:`source_id` stamp the changelog records the tasks write
    (see :class:`~foldstream.changelog.ChangelogFollower`).
    """

    def __init__(self, writer: RocksDBWriter, name: str, epoch: int) -> None:
        self._writer: RocksDBWriter | None = writer
        self._written_at: float | None = None  # of the last write not yet flushed
        self._name = name
        self.epoch = epoch
        self.source_id = writer.topic_ids()[0]
        self._users = 0
        self._state = threading.Condition()
        self._writing = threading.Lock()
        self.token = secrets.token_hex(8)

    def _enter(self) -> RocksDBWriter:
        with self._state:
            writer = self._writer
            if writer is None:
                raise PartitionClosed(f"{self._name} is no longer held by this instance")
            self._users += 1
            return writer

    def _exit(self) -> None:
        with self._state:
            self._users -= 1
            # Only a close waits (after clearing the writer): notifying on every lookup's exit
            # cost a batch lookup several microseconds per partition.
            if not self._users and self._writer is None:
                self._state.notify_all()

    def _use(self, read: Callable[[RocksDBWriter], T]) -> T:
        """``read`` applied to the open writer; a close waits until it returned."""
        writer = self._enter()
        try:
            return read(writer)
        finally:
            self._exit()

    def get(self, key: bytes) -> bytes | None:
        return self._use(lambda writer: writer.get(key))

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._use(lambda writer: writer.get_many(keys))

    def scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        return self._use(lambda writer: writer.scan(start, end, limit))

    def applied_offset(self) -> int | None:
        return self._use(RocksDBWriter.applied_offset)

    def changelog_offset(self) -> int | None:
        return self._use(RocksDBWriter.changelog_offset)

    def read(self, keys: list[bytes]) -> tuple[HoldState, list[bytes | None]]:
        """Where the partition stands and the values of ``keys``."""

        def read_all(writer: RocksDBWriter) -> tuple[HoldState, list[bytes | None]]:
            values: list[bytes | None] = []
            for start in range(0, len(keys), READ_CHUNK):
                values += writer.get_many(keys[start : start + READ_CHUNK])
            return self._hold_state(writer), values

        with self._writing:
            return self._use(read_all)

    def read_range(self, start: bytes, end: bytes, limit: int) -> tuple[HoldState, Entries]:
        """Where the partition stands and its entries in ``[start, end)``, up to ``limit``."""

        def read_entries(writer: RocksDBWriter) -> tuple[HoldState, Entries]:
            return self._hold_state(writer), writer.scan(start, end, limit)

        with self._writing:
            return self._use(read_entries)

    def _hold_state(self, writer: RocksDBWriter) -> HoldState:
        applied, changelog = writer.applied_offset(), writer.changelog_offset()
        return HoldState(self.token, self.epoch, applied, changelog, self.source_id)

    def write(
        self,
        token: str,
        read_offset: int | None,
        changes: Mapping[bytes, bytes | None],
        offset: int,
        changelog_offset: int | None,
    ) -> None:
        """Write what a task folded from the state it read as ``(token, read_offset)``."""

        def write_if_unchanged(writer: RocksDBWriter) -> None:
            if token != self.token or writer.applied_offset() != read_offset:
                raise PartitionClosed(f"{self._name} was written or moved since it was read")
            writer.write(
                changes, offset, changelog_offset=changelog_offset, changelog_epoch=self.epoch
            )

        with self._writing:
            self._use(write_if_unchanged)
            self._written_at = time.monotonic()

    def flush_if_idle(self, idle_s: float, min_entries: int) -> bool:
        """Flush the memtable if nothing was written for ``idle_s`` seconds and it holds at
        least ``min_entries`` writes; whether it did.

        A partition written in bulk (a rebuild, a restore, a load) and then only read keeps up
        to a memtable's worth of values in a skiplist, which every lookup searches before the
        table files, noticeably slower than the files' hash index (docs/decisions.md,
        "PlainTable for point stores"). Partitions still being written are left alone: flushing
        them would only make small table files.
        """
        written_at = self._written_at
        if written_at is None or time.monotonic() - written_at < idle_s:
            return False
        with self._writing:
            if self._written_at != written_at:
                return False  # written meanwhile
            self._written_at = None
        # Outside the lock: a task may read and write meanwhile (RocksDB flushes beside writes),
        # and a write during the flush marks the partition for the next idle flush.
        return self._use(lambda writer: writer.flush_memtable(min_entries))

    def refresh(self) -> None:
        return None

    def close(self) -> None:
        with self._state:
            writer, self._writer = self._writer, None
            while self._users:
                self._state.wait()
        if writer is not None:
            writer.close()
