from __future__ import annotations

from pathlib import Path

import pytest

from foldstream.errors import StateCorrupted
from foldstream.state import RocksDBReader, RocksDBWriter


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
