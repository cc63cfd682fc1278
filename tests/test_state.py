from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from foldstream.changelog.catalog import StoreCatalog
from foldstream.changelog.layout import StoreLayout
from foldstream.errors import StateCorrupted
from foldstream.examples.inventory import service as inventory
from foldstream.preflight import store_layouts
from foldstream.settings import AGGREGATE_STORE, Settings
from foldstream.state import RocksDBReader, RocksDBWriter
from foldstream.state.format import ORDERED_FORMAT, TABLE_FORMAT, stamped_format
from foldstream.state.host import StoreHost
from foldstream.state.rocksdb import META_CF


def test_values_and_offset_commit_together(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    reader = RocksDBReader(path)
    assert reader.applied_offset() is None
    writer = RocksDBWriter(path, identity="t/0")
    writer.put(b"a", b"1")
    assert writer.get(b"a") == b"1"  # the writer reads its own pending writes
    reader.refresh()
    assert reader.get(b"a") is None  # nothing is visible before the commit
    writer.commit(7)
    writer.close()
    reader.refresh()
    assert (reader.get(b"a"), reader.applied_offset()) == (b"1", 7)


def test_reader_follows_writers_that_reopen(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    reader = RocksDBReader(path, max_staleness=0)
    for offset in range(20):
        writer = RocksDBWriter(path, identity="t/0")
        if offset % 5 == 4:
            writer.delete(b"k")
        else:
            writer.put(b"k", str(offset).encode())
        writer.commit(offset)
        writer.close()
        expected = None if offset % 5 == 4 else str(offset).encode()
        assert reader.get(b"k") == expected
        assert reader.applied_offset() == offset


@pytest.mark.parametrize("table_format", [TABLE_FORMAT, ORDERED_FORMAT])
def test_many_keys_read_at_once_answer_as_each_read_alone(
    tmp_path: Path, table_format: str
) -> None:
    """Point stores read many keys one get at a time, ordered ones by a multi-get: the same
    values either way, None where a key is missing, in the keys' order, from the writer and
    from a reader; a value deleted in a later commit is gone from both."""
    path = tmp_path / "p0"
    writer = RocksDBWriter(path, identity="t/0", table_format=table_format)
    for n in range(0, 50, 2):
        writer.put(b"k%03d" % n, b"v%d" % n)
    writer.commit(1)
    writer.delete(b"k010")
    writer.commit(2)
    keys = [b"k%03d" % n for n in (49, 0, 10, 2, 2, 48, 7)]
    expected = [None, b"v0", None, b"v2", b"v2", b"v48", None]
    assert writer.get_many(keys) == [writer.get(key) for key in keys] == expected
    writer.close()
    reader = RocksDBReader(path, table_format=table_format)
    assert reader.get_many(keys) == expected
    assert reader.get_many([]) == []


def test_partition_identity_is_checked(tmp_path: Path) -> None:
    RocksDBWriter(tmp_path / "p0", identity="events/0").close()
    with pytest.raises(StateCorrupted, match="events/0"):
        RocksDBWriter(tmp_path / "p0", identity="events/1")


def test_reopening_a_partition_leaves_no_files_behind(tmp_path: Path) -> None:
    """Partitions are opened at every takeover and restore: the directory must not grow with
    the number of opens."""
    path = tmp_path / "p0"
    for offset in range(60):
        writer = RocksDBWriter(path, identity="t/0")
        for key in range(20):
            writer.put(b"k%d" % ((offset * 20 + key) % 300), b"1")
        writer.commit(offset)
        writer.close()
    files = sorted(p.name for p in path.iterdir())
    assert len(files) < 30, files


def test_a_partition_in_the_old_format_is_converted_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Directories written before PlainTable (block-based, unstamped) cannot be opened with
    today's options: a writer converts them, values and metadata as they are, and a reader
    says what will happen instead of RocksDB's 'Corruption'."""
    path = tmp_path / "stores" / "s" / "p0000"
    block_based = Options(raw_mode=True)  # rocksdict's defaults, as foldstream used them
    block_based.create_missing_column_families(True)
    old = Rdict(str(path), options=block_based, column_families={META_CF: block_based})
    old[b"k"] = b"old value"
    old.get_column_family(META_CF)[b"source-offset"] = b"7"
    old.get_column_family(META_CF)[b"identity"] = b"t/0"
    old.close()
    with pytest.raises(StateCorrupted, match="'block-based' format"):
        RocksDBReader(path)
    writer = RocksDBWriter(path, identity="t/0")
    assert (writer.get(b"k"), writer.applied_offset()) == (b"old value", 7)
    writer.put(b"k", b"new value")
    writer.commit(8)
    writer.close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["p0000"]
    assert stamped_format(path) == TABLE_FORMAT
    assert "converted" in caplog.text
    reader = RocksDBReader(path)
    assert (reader.get(b"k"), reader.applied_offset()) == (b"new value", 8)
    reader.close()


def test_a_conversion_cut_short_by_a_crash_is_finished(tmp_path: Path) -> None:
    """Converted into ``<partition>.converting`` and swapped in by two renames: a crash
    between them leaves no partition directory, only the finished conversion."""
    path = tmp_path / "p0000"
    writer = RocksDBWriter(path, identity="t/0")
    writer.put(b"k", b"v")
    writer.commit(3)
    writer.close()
    path.rename(tmp_path / "p0000.converting")
    (tmp_path / "p0000.replaced").mkdir()  # what the first rename left
    writer = RocksDBWriter(path, identity="t/0")
    assert (writer.get(b"k"), writer.applied_offset()) == (b"v", 3)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p0000"]


# The aggregate store is read only on the command side's cache misses: its table files' pages
# must not stay resident in the instance's memory as mapped pages. Each test writes a mapped
# store beside it, which must be mapped: the check cannot pass by mapping nothing.
KEYS = [b"k%06d" % n for n in range(2_000)]
VALUE = b"v" * 100


def mapped_stores(state_dir: Path) -> set[str]:
    """The stores under ``state_dir`` some of whose files this process has mapped."""
    with open("/proc/self/maps") as maps:
        names = (line.split(maxsplit=5)[-1].strip() for line in maps)
        # <state_dir>/stores/<store>/p0000/<file>
        return {Path(n).parent.parent.name for n in names if n.startswith(f"{state_dir}/")}


def test_a_store_held_unmapped_reads_its_files_without_mapping_them(tmp_path: Path) -> None:
    host = StoreHost(state_dir=tmp_path, unmapped={"snapshots"})
    try:
        for store in ("snapshots", "values"):
            host.open(store, 0, identity="t/0", epoch=1)
            held = host.partition(store, 0)
            assert held is not None
            state, _ = held.read([])
            held.write(state.token, state.applied_offset, dict.fromkeys(KEYS, VALUE), 0, None)
            assert held.flush_if_idle(0, 1)
            assert held.get_many(KEYS) == [VALUE] * len(KEYS)
        assert mapped_stores(tmp_path) == {"values"}
    finally:
        host.stop()


def test_a_local_copy_of_an_unmapped_store_reads_its_files_without_mapping_them(
    tmp_path: Path,
) -> None:
    # Standby copies, restores and stale-state rebuilds open their copies this way.
    writers = []
    try:
        for store, mapped in (("snapshots", False), ("values", True)):
            layout = StoreLayout("t", f"t.{store}.changelog", mapped_reads=mapped)
            writer = layout.local_copy(tmp_path, store, 0).open()
            writers.append(writer)
            for key in KEYS:
                writer.put(key, VALUE)
            writer.commit(0)
            assert writer.flush_memtable()
            assert writer.get_many(KEYS) == [VALUE] * len(KEYS)
        assert mapped_stores(tmp_path) == {"values"}
    finally:
        for writer in writers:
            writer.close()


def test_only_the_aggregate_store_is_read_without_mapping(tmp_path: Path) -> None:
    catalog = StoreCatalog(store_layouts(inventory, Settings(state_dir=tmp_path)))
    assert [store for store in catalog if store in catalog.unmapped] == [AGGREGATE_STORE]
