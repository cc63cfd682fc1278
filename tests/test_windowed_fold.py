"""Windowed aggregates and ordered entries folded into real RocksDB partitions (the fold the
Spark tasks run, without Spark): windows, grace, late records, retention, tombstones."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from foldstream.domain.records import EventRecord
from foldstream.errors import ConfigurationError, StateCorrupted
from foldstream.projections import OrderedProjection, WindowedAggregate, field_entry
from foldstream.projections.fold import commit_folded, fold_and_send, fold_partition
from foldstream.projections.poison import PoisonPolicy
from foldstream.state import RocksDBWriter
from foldstream.state.format import ORDERED_FORMAT
from foldstream.state.ordered_keys import (
    EXPIRY,
    STREAM_TIME,
    decode_int,
    entry_prefix,
    prefix_end,
    window_key,
)
from foldstream.times import iso_ms, to_epoch_ms

MINUTE = 60_000
T0 = to_epoch_ms("2026-05-01T10:00:00Z")


def count(state: dict[str, Any] | None, record: EventRecord) -> dict[str, Any]:
    return {"n": (0 if state is None else state["n"]) + json.loads(record.value or b"1")}


def windowed(**options: Any) -> WindowedAggregate:
    defaults: dict[str, Any] = dict(
        fold=count,
        size=timedelta(minutes=10),
        grace=timedelta(minutes=1),
        retention=timedelta(hours=1),
        topic="sales",
    )
    return WindowedAggregate("w", **(defaults | options))


def record(key: str, at: int, value: bytes | None = b"1") -> EventRecord:
    return EventRecord(key.encode(), value, (), at)


class Partition:
    """One partition of a store, folded record by record (chunks of ``chunk`` records)."""

    def __init__(self, path: Path, projection: Any) -> None:
        self.writer = RocksDBWriter(path, identity="t/0", table_format=ORDERED_FORMAT)
        self.projection = projection
        self.offset = 0
        self.late = 0

    def fold(self, *records: EventRecord, chunk: int = 1000) -> None:
        for first in range(0, len(records), chunk):
            numbered = []
            for each in records[first : first + chunk]:
                numbered.append((self.offset, each))
                self.offset += 1
            folded = fold_partition(self.projection, self.writer, numbered, None)
            assert folded is not None

    def windows(self, key: str) -> dict[str, Any]:
        prefix = entry_prefix(key.encode())
        return {
            iso_ms(decode_int(stored[len(prefix) :]))[11:16]: json.loads(value)["n"]
            for stored, value in self.writer.scan(prefix, prefix_end(prefix), 1000)
        }

    def index(self) -> int:
        return len(self.writer.scan(EXPIRY, STREAM_TIME, 1000))


@pytest.fixture
def partition(tmp_path: Path) -> Partition:
    return Partition(tmp_path / "p0", windowed())


def test_records_fall_in_their_tumbling_window_out_of_order_within_grace(
    partition: Partition,
) -> None:
    partition.fold(
        record("a", T0 + 1 * MINUTE),
        record("a", T0 + 10 * MINUTE + 30_000),
        record("a", T0 + 9 * MINUTE),  # out of order: its window closes at 10:11, stream 10:10:30
        record("b", T0 + 5 * MINUTE),  # another key: windows of its own, same stream time
    )
    assert partition.windows("a") == {"10:00": 2, "10:10": 1}
    assert partition.windows("b") == {"10:00": 1}
    assert decode_int(partition.writer.get(STREAM_TIME) or b"") == T0 + 10 * MINUTE + 30_000


def test_late_records_are_counted_by_the_fold(partition: Partition) -> None:
    projection = partition.projection
    chunk = projection.fold_chunk(
        partition.writer,
        [
            (0, record("a", T0 + 20 * MINUTE)),
            (1, record("a", T0 + 9 * MINUTE)),  # closed at 10:11 < 10:20: late
            (2, record("a", T0 + 10 * MINUTE)),  # 10:10-10:20 closes at 10:21: in time
        ],
    )
    assert chunk.late == 1
    partition.writer.commit(2)
    assert partition.windows("a") == {"10:10": 1, "10:20": 1}


def test_stream_time_carries_over_between_chunks(partition: Partition) -> None:
    partition.fold(record("a", T0 + 30 * MINUTE), record("a", T0 + 1 * MINUTE), chunk=1)
    assert partition.windows("a") == {"10:30": 1}  # the second was late in its own chunk


def test_hopping_windows_each_get_the_record(tmp_path: Path) -> None:
    hopping = Partition(
        tmp_path / "p0", windowed(size=timedelta(minutes=10), advance=timedelta(minutes=5))
    )
    hopping.fold(record("a", T0 + 7 * MINUTE), record("a", T0 + 12 * MINUTE))
    assert hopping.windows("a") == {"10:00": 1, "10:05": 2, "10:10": 1}


def test_windows_past_retention_are_deleted_with_their_index(partition: Partition) -> None:
    partition.fold(record("a", T0), record("b", T0 + 30 * MINUTE))
    assert partition.index() == 2
    # 10:00-10:10 is deleted once 10:10 + 1 h <= stream time; 10:30-10:40 stays.
    partition.fold(record("c", T0 + 70 * MINUTE - 1))
    assert partition.windows("a") == {"10:00": 1}
    partition.fold(record("c", T0 + 70 * MINUTE))
    assert partition.windows("a") == {}
    assert partition.windows("b") == {"10:30": 1}
    assert partition.index() == 3  # b's and c's two


def test_a_window_created_and_expired_in_one_chunk_leaves_nothing(partition: Partition) -> None:
    partition.fold(record("a", T0), record("z", T0 + 5 * 60 * MINUTE))
    assert partition.windows("a") == {}
    assert partition.index() == 1


def test_a_fold_returning_none_deletes_the_window(tmp_path: Path) -> None:
    def until_zero(state: dict[str, Any] | None, event: EventRecord) -> dict[str, Any] | None:
        n = (0 if state is None else state["n"]) + json.loads(event.value or b"0")
        return None if n == 0 else {"n": n}

    partition = Partition(tmp_path / "p0", windowed(fold=until_zero))
    partition.fold(record("a", T0, b"2"), record("a", T0 + 1, b"-2"))
    assert partition.windows("a") == {}
    assert partition.index() == 0


def test_tombstones_of_a_foreign_topic_are_left_out(partition: Partition) -> None:
    partition.fold(record("a", T0), record("a", T0 + 1, None))
    assert partition.windows("a") == {"10:00": 1}


def test_windowed_store_declarations_are_checked() -> None:
    for bad in (
        dict(size=timedelta(0)),
        dict(size=timedelta(minutes=1), advance=timedelta(minutes=2)),
        dict(size=timedelta(microseconds=1500)),
        dict(size=timedelta(hours=1), advance=timedelta(seconds=1)),
        dict(grace=timedelta(hours=2), retention=timedelta(hours=1)),
        dict(grace=-timedelta(minutes=1)),
    ):
        with pytest.raises(ConfigurationError):
            windowed(**bad)


def test_ordered_entries_keep_equal_sort_keys_and_a_tombstone_clears_the_key(
    tmp_path: Path,
) -> None:
    store = Partition(
        tmp_path / "p0",
        OrderedProjection("o", topic="t", sort_key="time", entry=field_entry("at")),
    )

    def booking(key: str, at: str, trip: str) -> EventRecord:
        return EventRecord(key.encode(), json.dumps({"at": at, "trip": trip}).encode(), ())

    store.fold(
        booking("a", "2026-05-01T10:00:00Z", "x"),
        booking("a", "2026-05-01T09:00:00Z", "y"),
        booking("a", "2026-05-01T10:00:00Z", "z"),  # the same time as x: both kept, x first
        booking("b", "2026-05-01T08:00:00Z", "w"),
    )

    def trips(key: str) -> list[str]:
        prefix = entry_prefix(key.encode())
        found = store.writer.scan(prefix, prefix_end(prefix), 1000)
        return [json.loads(value)["trip"] for _, value in found]

    assert trips("a") == ["y", "x", "z"]
    store.fold(booking("a", "2026-05-01T11:00:00Z", "v"), EventRecord(b"a", None, ()))
    assert trips("a") == [] and trips("b") == ["w"]
    store.fold(booking("a", "2026-05-01T07:00:00Z", "u"))
    assert trips("a") == ["u"]


def test_a_point_store_directory_is_never_opened_as_an_ordered_one(tmp_path: Path) -> None:
    RocksDBWriter(tmp_path / "p0", identity="t/0").close()
    with pytest.raises(StateCorrupted, match="declared"):
        RocksDBWriter(tmp_path / "p0", identity="t/0", table_format=ORDERED_FORMAT)
    RocksDBWriter(tmp_path / "p1", identity="t/1", table_format=ORDERED_FORMAT).close()
    with pytest.raises(StateCorrupted, match="declared"):
        RocksDBWriter(tmp_path / "p1", identity="t/1")


def test_a_record_without_a_time_or_a_key_is_refused_by_the_fold_only(partition: Partition) -> None:
    """Reading ahead skips it; folding it raises, for the projection's error handling."""
    projection = partition.projection
    broken = [(0, EventRecord(b"a", b"1", (), None)), (1, EventRecord(None, b"1", (), T0))]  # type: ignore[arg-type]
    assert projection.read_keys(broken) == [STREAM_TIME]
    for each in broken:
        with pytest.raises(ValueError):
            projection.fold_chunk(partition.writer, [each])


@pytest.mark.parametrize("on_error", ["skip", "stop"])
def test_a_poison_record_in_a_chunk_meets_the_stores_policy_and_only_it(
    tmp_path: Path, on_error: str
) -> None:
    """A record without a key amid good ones: with ``skip`` the chunk's other records are all
    folded and the stored offset passes it; with ``stop`` the records before it are folded and
    the partition stops at it. Nothing the failed whole-chunk attempt wrote is kept."""
    projection = windowed(on_error=on_error)
    writer = RocksDBWriter(tmp_path / "p", identity="t/0", table_format=ORDERED_FORMAT)
    chunk = [
        (0, record("a", T0)),
        (1, EventRecord(None, b"1", (), T0)),  # no key: no place in an ordered store
        (2, record("a", T0 + MINUTE)),
    ]
    policy = PoisonPolicy("w", on_error, "sales", 0)  # type: ignore[arg-type]
    folded = fold_and_send(projection, writer, chunk, None, policy)
    assert folded is not None
    assert commit_folded(folded) is not None
    window = json.loads(writer.get(window_key(b"a", T0)) or b"null")
    if on_error == "skip":
        assert (folded.applied, folded.last_offset, window) == (3, 2, {"n": 2})
        assert folded.outcomes == {"skipped": 1} and folded.stop is None
    else:
        assert (folded.applied, folded.last_offset, window) == (1, 0, {"n": 1})
        assert folded.stop is not None and folded.stop[0] == 1


class ReadsRecorded:
    """A partition's writer that records the keys a fold gets (the keys a task reads ahead
    from the store host must include them all)."""

    def __init__(self, writer: RocksDBWriter) -> None:
        self.writer = writer
        self.got: set[bytes] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)

    def get(self, key: bytes) -> bytes | None:
        self.got.add(key)
        return self.writer.get(key)


@pytest.mark.parametrize("advance", [None, timedelta(minutes=3)])
def test_the_keys_read_ahead_are_every_key_the_fold_gets(tmp_path: Path, advance: Any) -> None:
    projection = windowed(advance=advance)
    chunk = [
        (n, record(f"k{n % 3}", T0 + n * 7 * MINUTE - (20 * MINUTE if n % 5 == 4 else 0)))
        for n in range(40)
    ]
    writer = ReadsRecorded(
        RocksDBWriter(tmp_path / "p", identity="t/0", table_format=ORDERED_FORMAT)
    )
    projection.fold_chunk(writer, chunk[:20])  # some windows exist before the next chunk
    writer.got.clear()
    projection.fold_chunk(writer, chunk[20:])
    ahead = projection.read_keys(chunk[20:])
    assert writer.got <= set(ahead)
    assert len(ahead) == len(set(ahead)) and ahead[0] == STREAM_TIME
