"""The on-disk formats of store partitions, stamped in each partition directory: RocksDB's
PlainTable for point stores (:data:`TABLE_FORMAT`), block-based tables for ordered and windowed
stores (:data:`ORDERED_FORMAT`, iterated in key order); and the conversion in place of a point
store's directory written in the block-based format foldstream used before the stamp existed.

A directory is only ever opened in the format stamped in it: one of another format than its
store declares is refused (:class:`~foldstream.errors.StateCorrupted`), never reinterpreted."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Options,
    PlainTableFactoryOptions,
    Rdict,
    SliceTransform,
    WriteBatch,
)

from foldstream.errors import StateCorrupted

#: The format of a point store's partitions, stamped in :data:`FORMAT_FILE` of its directory.
TABLE_FORMAT = "plain-table/1"
#: The format of an ordered (or windowed) store's partitions: block-based tables, in key order.
ORDERED_FORMAT = "ordered/1"
FORMATS = (TABLE_FORMAT, ORDERED_FORMAT)
FORMAT_FILE = "FOLDSTREAM-FORMAT"
#: Directories without a stamp were written by foldstream before 2026-11-24.
BLOCK_BASED = "block-based"
#: RocksDB info logs kept per partition. Each open starts a new one, and partitions are
#: reopened at every takeover and, read-only, by snapshots: unbounded, old ones pile up.
KEPT_INFO_LOGS = 2
WRITE_BUFFER_BYTES = 8 << 20
_CONVERSION_BATCH = 10_000
# Writers of one partition (its owner, a standby copy) may open it at once around a handover.
_preparing = threading.Lock()
log = logging.getLogger(__name__)


def _common_options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_keep_log_file_num(KEPT_INFO_LOGS)
    # Writers stay open for as long as an instance owns a partition: bound each partition's
    # memtables (the default is 64 MB each) so that many partitions fit an instance's budget.
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    return options


def store_options(table_format: str = TABLE_FORMAT, *, mapped_reads: bool = True) -> Options:
    """The options a partition database of ``table_format`` is opened with (also needed to
    read one). ``mapped_reads=False`` reads a point store's files with ``pread`` rather than
    through ``mmap``: for a store read only on a cache's misses (the aggregate store), whose
    mapped pages would otherwise stay resident in, and count against, the process's memory;
    each table's index is then read into the heap. Ordered stores are never mapped."""
    if table_format == ORDERED_FORMAT:
        return ordered_options()
    if table_format != TABLE_FORMAT:
        raise ValueError(f"unknown store format {table_format!r}; known: {FORMATS}")
    options = _common_options()
    # Stores are only ever read by point lookups, never iterated. PlainTable (files mapped
    # unless ``mapped_reads`` is off, a hash index over whole keys) answers random multi-gets
    # several times faster than block-based tables however they are tuned (docs/decisions.md,
    # "PlainTable for point stores"). Its cost: files are uncompressed and carry no block
    # checksums; the changelog is the copy of record. The index is stored in the file, or
    # every open would rebuild it.
    table = PlainTableFactoryOptions()
    table.store_index_in_file = True  # type: ignore[attr-defined]  # missing from the stubs
    options.set_plain_table_factory(table)
    options.set_prefix_extractor(SliceTransform.create_noop())
    options.set_allow_mmap_reads(mapped_reads)
    return options


def ordered_options() -> Options:
    """Ordered stores are read by ranges (a seek, then the next keys in order), which PlainTable
    cannot do without a prefix extractor fitted to the keys: RocksDB's default block-based
    tables, with a bloom filter for the point reads a windowed fold makes."""
    options = _common_options()
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


def stamped_format(path: Path) -> str | None:
    """The format a partition directory holds, None if it holds no database yet."""
    if not (path / "CURRENT").exists():
        return None
    stamped = _stamp_of(path)
    return BLOCK_BASED if stamped is None else stamped


def prepare_for_writer(path: Path, table_format: str = TABLE_FORMAT) -> None:
    """Make ``path`` ready to be opened for writing with :func:`store_options` of
    ``table_format``: stamp a new directory, convert a point store's directory in the old
    block-based format in place (values and metadata as they are), finish or clean up a
    conversion a crash interrupted, and refuse a directory of another format."""
    converting = path.with_name(f"{path.name}.converting")
    replaced = path.with_name(f"{path.name}.replaced")
    with _preparing:
        if converting.exists() and _stamp_of(converting) != TABLE_FORMAT:
            shutil.rmtree(converting)  # cut short: it starts again
        found = stamped_format(path)
        convertible = table_format == TABLE_FORMAT and found == BLOCK_BASED
        if convertible and not converting.exists():
            _convert(path, converting)
        elif found not in (None, table_format) and not convertible:
            raise StateCorrupted(wrong_format(path, found, table_format))
        if converting.exists():  # converted, possibly before a crash between the renames
            if path.exists():
                path.rename(replaced)
            converting.rename(path)
        if replaced.exists():
            shutil.rmtree(replaced)
        if stamped_format(path) is None:
            path.mkdir(parents=True, exist_ok=True)
            _write_stamp(path, table_format)


def wrong_format(path: Path, found: str | None, expected: str) -> str:
    """What :class:`StateCorrupted` says of a directory in the ``found`` format, opened as
    ``expected``."""
    if found not in FORMATS:
        return (
            f"{path} holds a database in the {found!r} format, which this version of"
            f" foldstream cannot open as {expected!r}"
        )
    return (
        f"{path} holds a store in the {found!r} format, but its store is declared as one kept"
        f" in {expected!r} (was it declared another kind of store before?): delete the store's"
        " directory to have it rebuilt, or give the store a new name"
    )


def _convert(path: Path, converting: Path) -> None:
    started = time.monotonic()
    names = Rdict.list_cf(str(path), Options(raw_mode=True))
    families = [name for name in names if name != "default"]
    old = Rdict(
        str(path),
        options=Options(raw_mode=True),
        column_families={name: Options(raw_mode=True) for name in families},
        access_type=AccessType.read_only(),
    )
    converting.mkdir(parents=True)
    new = Rdict(
        str(converting),
        options=store_options(),
        column_families={name: store_options() for name in families},
    )
    copied = 0
    try:
        for name in names:
            source = old if name == "default" else old.get_column_family(name)
            handle = None if name == "default" else new.get_column_family_handle(name)
            batch = WriteBatch(raw_mode=True)
            for key, value in source.items():
                batch.put(key, value, handle)
                copied += 1
                if copied % _CONVERSION_BATCH == 0:
                    new.write(batch)
                    batch = WriteBatch(raw_mode=True)
            new.write(batch)
            del source, handle  # column family objects keep their database open
        new.flush()
    finally:
        new.close()
        old.close()
    _write_stamp(converting, TABLE_FORMAT)  # last: a directory without it is a conversion cut short
    log.warning(
        "converted %s from the %r format to %r in place: %d records in %.1fs",
        path,
        BLOCK_BASED,
        TABLE_FORMAT,
        copied,
        time.monotonic() - started,
    )


def _stamp_of(path: Path) -> str | None:
    stamp = path / FORMAT_FILE
    return stamp.read_text().strip() if stamp.exists() else None


def _write_stamp(path: Path, table_format: str) -> None:
    # Written whole or not at all, and durable before anything relies on it.
    partial = path / f"{FORMAT_FILE}.partial"
    with open(partial, "w") as file:
        file.write(table_format + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path / FORMAT_FILE)
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
