"""RocksDB state (rocksdict, raw bytes): data in the default column family, foldstream's own
reserved keys (source offset, changelog position, identity stamp, the ids of the topics the
state was built from) in a metadata column family.

Point stores' partitions are written in RocksDB's PlainTable format, ordered stores' in
block-based tables, stamped in each directory before its database is created (:mod:`.format`);
a writer converts a point store's directory in an earlier format first. Ordered stores are read
by :meth:`~_RocksDBPartition.scan` too.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any, cast

from rocksdict import AccessType, Rdict, ReadOptions, WriteBatch
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from foldstream.errors import StateCorrupted
from foldstream.state.base import Entries, PartitionReader, PartitionWriter, overlay_scan
from foldstream.state.format import (
    BLOCK_BASED,
    FORMATS,
    TABLE_FORMAT,
    prepare_for_writer,
    stamped_format,
    store_options,
    wrong_format,
)

META_CF = "__foldstream__"
_OFFSET = b"source-offset"
_CHANGELOG_OFFSET = b"changelog-offset"
_CHANGELOG_EPOCH = b"changelog-epoch"
_UNFINISHED_BATCH = b"changelog-unfinished-batch"
_IDENTITY = b"identity"
_SOURCE_TOPIC_ID = b"source-topic-id"
_CHANGELOG_TOPIC_ID = b"changelog-topic-id"
_MEMTABLE_ENTRIES = "rocksdb.num-entries-active-mem-table"
_DELETED = object()
log = logging.getLogger(__name__)


def partition_path(state_dir: Path, store: str, partition: int) -> Path:
    """Where partition ``partition`` of ``store`` lives under ``state_dir``."""
    return Path(state_dir) / "stores" / store / f"p{partition:04d}"


def is_lock_held(exc: BaseException) -> bool:
    """Whether ``exc`` is RocksDB's error for a partition another writer holds open (its
    LOCK file, held by another process or by this one)."""
    text = str(exc)
    return "/LOCK:" in text or "lock hold by current process" in text


def discard_partition(path: Path) -> None:
    """Delete the partition directory ``path`` (closed), as one step: it is renamed aside
    first, so a crash leaves either the whole directory or none of it in place."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.discarded")
    shutil.rmtree(aside, ignore_errors=True)  # left by a crash during an earlier discard
    if path.exists():
        path.rename(aside)
        shutil.rmtree(aside)


def _open(
    path: Path, table_format: str, access: AccessType | None = None, *, mapped_reads: bool = True
) -> Rdict:
    if access is None:
        prepare_for_writer(path, table_format)
    elif (found := stamped_format(path)) != table_format:
        if found == BLOCK_BASED and table_format == TABLE_FORMAT:
            raise StateCorrupted(
                f"{path} holds a database in the {found!r} format, not {TABLE_FORMAT!r}: it is"
                " converted in place when this instance next opens the partition for writing"
            )
        raise StateCorrupted(wrong_format(path, found, table_format))
    # Every column family must be named at open, or a secondary cannot follow the primary.
    kwargs = {"access_type": access} if access is not None else {}
    options = store_options(table_format, mapped_reads=mapped_reads)
    return Rdict(str(path), options=options, column_families={META_CF: options}, **kwargs)


class _RocksDBPartition(PartitionReader):
    def __init__(self, db: Rdict, table_format: str) -> None:
        self._db = db
        self._meta = db.get_column_family(META_CF)
        # RocksDB's multi-get sorts and batches the keys for block reads, which PlainTable
        # files do not have: for them, one get per key costs less (docs/benchmarks.md, "Batch
        # lookups: one get per key").
        self._get_one_by_one = table_format == TABLE_FORMAT

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        if self._get_one_by_one:
            return list(map(self._db.get, keys))
        # One multi-get (rocksdict's stub types keys as a list of scalars, bytes among them).
        return cast("list[bytes | None]", self._db.get(cast(Any, keys)))

    def scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        bounds = ReadOptions()
        bounds.set_iterate_upper_bound(end)
        # rocksdict's items() steps the iterator in Rust: a call per entry instead of the four
        # of key(), value(), next() and valid() (its stub types the items as scalars).
        items = cast(
            "Iterator[tuple[bytes, bytes]]", self._db.items(from_key=start, read_opt=bounds)
        )
        return list(islice(items, limit))

    def applied_offset(self) -> int | None:
        raw = self._meta.get(_OFFSET)
        return None if raw is None else int(raw)

    def changelog_offset(self) -> int | None:
        raw = self._meta.get(_CHANGELOG_OFFSET)
        return None if raw is None else int(raw)

    def changelog_epoch(self) -> int:
        """The newest changelog writer epoch the state reflects (0: none seen)."""
        raw = self._meta.get(_CHANGELOG_EPOCH)
        return 0 if raw is None else int(raw)

    def unfinished_batch(self) -> bytes | None:
        """The changelog batch the copy's position is inside of (see
        :meth:`RocksDBWriter.note_changelog`), None when it is between batches."""
        raw: bytes | None = self._meta.get(_UNFINISHED_BATCH)
        return raw

    def topic_ids(self) -> tuple[str | None, str | None]:
        """The ids of the source and changelog topics this state was built from, as stamped
        by :meth:`RocksDBWriter.stamp_topic_ids` (None: not stamped, e.g. by an earlier
        foldstream)."""
        stamped = (self._meta.get(_SOURCE_TOPIC_ID), self._meta.get(_CHANGELOG_TOPIC_ID))
        source, changelog = (None if raw is None else raw.decode() for raw in stamped)
        return source, changelog

    def close(self) -> None:
        # Column family objects keep the DB (and its lock) alive until they are dropped too.
        self.__dict__.pop("_meta", None)
        self.__dict__.pop("_meta_handle", None)
        self._db.close()


class RocksDBWriter(_RocksDBPartition, PartitionWriter):
    """Opens (creating) a partition as its only writer.

    ``identity`` (e.g. ``"inventory.events/3"``) is stamped on first use and checked on every
    open, so a directory can never silently serve another topic's or partition's data; so is
    its ``table_format`` (:mod:`.format`). ``mapped_reads=False`` reads its files without
    ``mmap`` (:func:`~.format.store_options`).
    """

    def __init__(
        self,
        path: Path,
        *,
        identity: str,
        table_format: str = TABLE_FORMAT,
        mapped_reads: bool = True,
    ) -> None:
        super().__init__(_open(Path(path), table_format, mapped_reads=mapped_reads), table_format)
        self._meta_handle = self._db.get_column_family_handle(META_CF)
        stamped = self._meta.get(_IDENTITY)
        if stamped is None:
            self._meta.put(_IDENTITY, identity.encode())
        elif stamped.decode() != identity:
            self.close()
            raise StateCorrupted(f"{path} holds state of {stamped.decode()!r}, not {identity!r}")
        self._pending: dict[bytes, object] = {}

    def get(self, key: bytes) -> bytes | None:
        pending = self._pending.get(key)
        if pending is _DELETED:
            return None
        if pending is not None:
            return pending  # type: ignore[return-value]
        return super().get(key)

    def scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        if not self._pending:
            return super().scan(start, end, limit)
        pending = {k: None if v is _DELETED else v for k, v in self._pending.items()}
        return overlay_scan(super().scan, pending, start, end, limit)  # type: ignore[arg-type]

    def put(self, key: bytes, value: bytes) -> None:
        self._pending[key] = value

    def delete(self, key: bytes) -> None:
        self._pending[key] = _DELETED

    def commit(
        self,
        offset: int,
        *,
        changelog_offset: int | None = None,
        changelog_epoch: int | None = None,
    ) -> None:
        changes = {k: (None if v is _DELETED else v) for k, v in self._pending.items()}
        self.write(
            changes,  # type: ignore[arg-type]
            offset,
            changelog_offset=changelog_offset,
            changelog_epoch=changelog_epoch,
        )
        self._pending.clear()

    def write(
        self,
        changes: Mapping[bytes, bytes | None],
        offset: int,
        *,
        changelog_offset: int | None = None,
        changelog_epoch: int | None = None,
    ) -> None:
        """Write ``changes`` (None deletes), ``offset``, ``changelog_offset`` and
        ``changelog_epoch`` in one batch, bypassing the buffer of :meth:`put` and
        :meth:`delete`."""
        batch = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        batch.put(_OFFSET, str(offset).encode(), self._meta_handle)
        self._put_changelog(batch, changelog_offset, changelog_epoch)
        self._db.write(batch)

    def note_changelog(self, offset: int, epoch: int, unfinished: bytes | None = None) -> None:
        """Record changelog records up to ``offset`` as seen (none of them to be applied),
        ``epoch`` as the newest writer epoch seen and ``unfinished`` as the batch that
        ``offset`` is inside of (its records after it are not to be applied either), leaving
        values and source offset alone."""
        batch = WriteBatch(raw_mode=True)
        self._put_changelog(batch, offset, epoch)
        if unfinished is None:
            batch.delete(_UNFINISHED_BATCH, self._meta_handle)
        else:
            batch.put(_UNFINISHED_BATCH, unfinished, self._meta_handle)
        self._db.write(batch)

    def stamp_topic_ids(self, source: str | None, changelog: str | None) -> None:
        """Record the ids of the topics this state is built from (a None leaves a stamp as it
        is): a copy that finds other ids later knows the topics were recreated under it."""
        stamped = self.topic_ids()
        if (source or stamped[0], changelog or stamped[1]) == stamped:
            return  # unchanged: no write, which would cost a flush at close
        batch = WriteBatch(raw_mode=True)
        for name, topic_id in ((_SOURCE_TOPIC_ID, source), (_CHANGELOG_TOPIC_ID, changelog)):
            if topic_id is not None:
                batch.put(name, topic_id.encode(), self._meta_handle)
        self._db.write(batch)

    def _put_changelog(self, batch: WriteBatch, offset: int | None, epoch: int | None) -> None:
        for name, number in ((_CHANGELOG_OFFSET, offset), (_CHANGELOG_EPOCH, epoch)):
            if number is not None:
                batch.put(name, str(number).encode(), self._meta_handle)

    def flush_memtable(self, min_entries: int = 1) -> bool:
        """Write the values still only in the memtable to a table file if it holds at least
        ``min_entries`` writes; whether it did. Lookups then probe the file's hash index
        instead of searching the memtable."""
        if (self._db.property_int_value(_MEMTABLE_ENTRIES) or 0) < max(min_entries, 1):
            return False
        self._db.flush()
        return True

    def close(self) -> None:
        # Flushed, so that the next opener (a read-only snapshot, a standby copy after a
        # takeover elsewhere) starts from SSTs rather than replaying this writer's WAL.
        self._db.flush()
        super().close()


class RocksDBReader(_RocksDBPartition):
    """Reads a partition written by other processes, as a read-only snapshot.

    For partitions no store host holds here (tools, a lookup racing a partition's move).
    RocksDB secondaries were seen to stop following a primary that is reopened often; the
    snapshot is instead reopened whenever the database's version files change (``CURRENT`` and
    the manifest's size and mtime, read *before* opening, so a commit racing an open is
    caught by the next refresh). :meth:`get` refreshes when the last check is older than
    ``max_staleness`` seconds. The directory must hold ``table_format``.
    """

    def __init__(
        self, path: Path, *, max_staleness: float = 0.005, table_format: str = TABLE_FORMAT
    ) -> None:
        if table_format not in FORMATS:
            raise ValueError(f"unknown store format {table_format!r}; known: {FORMATS}")
        self._path = Path(path)
        self._format = table_format
        if not (self._path / "CURRENT").exists():
            # A read-only open needs an existing database: create the empty partition first.
            _open(self._path, table_format).close()
        for attempt in Retrying(
            stop=stop_after_delay(5),
            wait=wait_fixed(0.01),
            retry=retry_if_exception_type(FileNotFoundError),
            reraise=True,
        ):
            with attempt:
                # A writer may be switching manifests right now: read the signature again.
                self._signature = self._version_signature()
        super().__init__(_open(self._path, table_format, AccessType.read_only()), table_format)
        self._max_staleness = max_staleness
        self._checked_at = time.monotonic()

    def _version_signature(self) -> tuple[bytes, int, int]:
        current = (self._path / "CURRENT").read_bytes()
        manifest = os.stat(self._path / current.decode().strip())
        return current, manifest.st_size, manifest.st_mtime_ns

    def refresh(self) -> None:
        self._checked_at = time.monotonic()
        try:
            signature = self._version_signature()
            if signature == self._signature:
                return
            fresh = _open(self._path, self._format, AccessType.read_only())
        except Exception:  # noqa: BLE001 - a writer is mid-switch; the old snapshot stays valid
            log.debug("refresh of %s deferred", self._path, exc_info=True)
            return
        old = self._db
        self._db, self._meta, self._signature = fresh, fresh.get_column_family(META_CF), signature
        old.close()

    def get(self, key: bytes) -> bytes | None:
        if time.monotonic() - self._checked_at > self._max_staleness:
            self.refresh()
        return super().get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        if time.monotonic() - self._checked_at > self._max_staleness:
            self.refresh()
        return super().get_many(keys)

    def scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        if time.monotonic() - self._checked_at > self._max_staleness:
            self.refresh()
        return super().scan(start, end, limit)
