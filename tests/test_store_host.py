"""The store host: partitions held open by the instance, read and written by projection tasks
over an authenticated local connection, and read by lookups directly."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from pathlib import Path

import pytest

from foldstream.errors import StateCorrupted
from foldstream.state import RocksDBReader, partition_path
from foldstream.state.host import (
    PartitionClosed,
    PartitionStop,
    RemotePartition,
    StoreHost,
    call_host,
)
from foldstream.state.local import LocalStores


@pytest.fixture
def host(tmp_path: Path) -> Iterator[StoreHost]:
    host = StoreHost(state_dir=tmp_path)
    host.start()
    host.open("kv", 0, identity="t/0", epoch=1)
    yield host
    host.stop()


def remote(host: StoreHost, keys: list[bytes], partition: int = 0) -> RemotePartition:
    return RemotePartition(host.address, host.authkey, "kv", partition, keys)


def committed(host: StoreHost, key: bytes, value: bytes, offset: int) -> None:
    """``key`` = ``value`` in partition 0 of ``kv``, committed by a task at ``offset``."""
    task = remote(host, [key])
    task.put(key, value)
    task.commit(offset)


def test_a_task_report_reaches_on_task_and_is_accepted_without_it(tmp_path: Path) -> None:
    reports: list[tuple[str, dict[str, float], int]] = []
    with_callback = StoreHost(
        state_dir=tmp_path / "a",
        on_task=lambda store, steps, records: reports.append((store, steps, records)),
    )
    without = StoreHost(state_dir=tmp_path / "b")
    for host in (with_callback, without):
        host.start()
        try:
            call_host(host.address, host.authkey, ("task", "kv", None, {"fold": 0.5}, 7))
        finally:
            host.stop()
    assert reports == [("kv", {"fold": 0.5}, 7)]


def test_a_failing_on_task_is_logged_and_never_fails_the_task(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(store: str, steps: dict[str, float], records: int) -> None:
        raise ValueError("metrics are down")

    host = StoreHost(state_dir=tmp_path, on_task=broken)
    host.start()
    try:
        with caplog.at_level(logging.ERROR, logger="foldstream.state.host"):
            assert call_host(host.address, host.authkey, ("task", "kv", None, {}, 0)) is None
    finally:
        host.stop()
    assert "recording a projection task's steps" in caplog.text
    assert "metrics are down" in caplog.text


def test_a_task_reads_folds_and_commits_through_the_host(host: StoreHost) -> None:
    first = remote(host, [b"a", b"b"])
    assert first.applied_offset() is None
    assert first.get(b"a") is None
    first.put(b"a", b"1")
    first.put(b"b", b"2")
    assert first.get(b"a") == b"1"  # a task sees its own changes before committing
    first.commit(7)
    held = host.partition("kv", 0)
    assert held is not None
    assert (held.get(b"a"), held.get(b"b"), held.applied_offset()) == (b"1", b"2", 7)

    second = remote(host, [b"a"])
    assert (second.applied_offset(), second.get(b"a")) == (7, b"1")
    assert second.get(b"b") == b"2"  # a key not read up front is fetched on demand
    second.delete(b"a")
    second.commit(9, changelog_offset=3)
    assert (held.get(b"a"), held.applied_offset(), held.changelog_offset()) == (None, 9, 3)


def test_a_partition_not_held_is_refused_and_nothing_is_written(host: StoreHost) -> None:
    with pytest.raises(PartitionClosed):
        remote(host, [b"a"], partition=1)
    task = remote(host, [b"a"])
    task.put(b"a", b"1")
    host.close([("kv", 0)])  # moved to another instance while the task folded
    with pytest.raises(PartitionClosed):
        task.commit(1)
    with RocksDBReader(partition_path(host.state_dir, "kv", 0)) as reader:
        assert (reader.get(b"a"), reader.applied_offset()) == (None, None)


def test_a_refused_store_turns_its_tasks_away_and_still_answers_lookups(
    host: StoreHost,
) -> None:
    committed(host, b"a", b"1", 1)
    late = remote(host, [b"a"])  # read before the refusal
    late.put(b"a", b"2")
    host.refuse("kv")  # a store version retired from a query it shares
    with pytest.raises(PartitionClosed, match="retired"):
        remote(host, [b"a"])
    with pytest.raises(PartitionClosed):
        late.commit(2)
    held = host.partition("kv", 0)
    assert held is not None and (held.get(b"a"), held.applied_offset()) == (b"1", 1)
    assert host.stopped() == {}  # not a partition stopped at a poison record


def test_a_client_without_the_key_is_turned_away(host: StoreHost) -> None:
    with pytest.raises(AuthenticationError):
        RemotePartition(host.address, b"not the key", "kv", 0, [b"a"])


def test_a_partition_of_another_topic_is_not_opened(host: StoreHost) -> None:
    host.close([("kv", 0)])
    with pytest.raises(StateCorrupted):
        host.open("kv", 0, identity="other/0", epoch=1)


def test_lookups_see_a_commit_at_once_and_a_closed_partition_from_disk(host: StoreHost) -> None:
    readers = LocalStores(host.state_dir, host=host)
    try:
        task = remote(host, [b"a"])
        task.put(b"a", b"1")
        task.commit(0)
        assert readers.get("kv", 0, b"a") == b"1"
        assert readers.get_many("kv", 0, [b"a", b"z"]) == [b"1", None]
        assert readers.next_offset("kv", 0) == 1
        readers.release([("kv", 0)])
        assert host.partition("kv", 0) is None
        assert readers.get("kv", 0, b"a") == b"1"  # a late lookup reads the flushed state
    finally:
        readers.close()


def test_a_task_that_outlived_its_partition_cannot_overwrite_newer_state(host: StoreHost) -> None:
    stale = remote(host, [b"a"])
    stale.put(b"a", b"stale")
    host.close([("kv", 0)])  # moved away and back: restored with newer state, held again
    host.open("kv", 0, identity="t/0", epoch=1)
    newer = remote(host, [b"a"])
    newer.put(b"a", b"new")
    newer.commit(5)
    with pytest.raises(PartitionClosed):
        stale.commit(3)
    held = host.partition("kv", 0)
    assert held is not None
    assert (held.get(b"a"), held.applied_offset()) == (b"new", 5)


def test_of_two_tasks_that_read_the_same_state_only_the_first_writes(host: StoreHost) -> None:
    # e.g. a task of a failed query still running beside the restarted query's task
    first, second = remote(host, [b"a"]), remote(host, [b"a"])
    first.put(b"a", b"1")
    first.commit(0)
    second.put(b"a", b"1")
    with pytest.raises(PartitionClosed):
        second.commit(0)


def test_a_hold_writes_above_every_epoch_its_copy_has_seen(host: StoreHost) -> None:
    task = remote(host, [b"a"])
    assert task.epoch == 1
    task.put(b"a", b"1")
    task.commit(0, changelog_offset=0)
    held = host.partition("kv", 0)
    assert held is not None
    host.close([("kv", 0)])  # e.g. moved away: the copy keeps the epoch of its last write
    assert host.open("kv", 0, identity="t/0", epoch=1) == 2
    assert remote(host, [b"a"]).epoch == 2
    assert host.open("kv", 0, identity="t/0", epoch=9) == 2  # already held: unchanged
    host.close([("kv", 0)])
    assert host.open("kv", 0, identity="t/0", epoch=9) == 9


def test_a_partition_left_idle_after_writes_has_its_memtable_flushed(tmp_path: Path) -> None:
    host = StoreHost(state_dir=tmp_path, idle_flush_s=0.2, idle_flush_entries=100)
    host.start()
    try:
        host.open("kv", 0, identity="t/0", epoch=1)
        host.open("kv", 1, identity="t/1", epoch=1)
        held = [host.partition("kv", p) for p in (0, 1)]
        assert held[0] is not None and held[1] is not None
        tables = [partition_path(tmp_path, "kv", p) for p in (0, 1)]
        for p, rows in ((0, 500), (1, 10)):  # partition 1: too few writes to be worth a file
            task = remote(host, [], partition=p)
            for n in range(rows):
                task.put(b"k%d" % n, b"v%d" % n)
            task.commit(rows)

        def table_files(path: Path) -> int:
            return len(list(path.glob("*.sst")))

        before = [table_files(path) for path in tables]
        deadline = time.monotonic() + 10
        while table_files(tables[0]) == before[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert table_files(tables[0]) == before[0] + 1, "the idle partition was not flushed"
        assert table_files(tables[1]) == before[1]
        assert [held[0].get(b"k%d" % n) for n in (0, 499)] == [b"v0", b"v499"]
        assert held[0].applied_offset() == 500
        # Nothing written since: no more flushes.
        time.sleep(0.5)
        assert table_files(tables[0]) == before[0] + 1
    finally:
        host.stop()


def test_writes_between_idle_flushes_keep_every_value(tmp_path: Path) -> None:
    """Bursts of writes with pauses just over the idle time: flushes run between and beside
    the tasks' writes, and every value and the source offset stay as last written."""
    host = StoreHost(state_dir=tmp_path, idle_flush_s=0.05, idle_flush_entries=1)
    host.start()
    try:
        host.open("kv", 0, identity="t/0", epoch=1)
        held = host.partition("kv", 0)
        assert held is not None
        table = partition_path(tmp_path, "kv", 0)
        for burst in range(20):
            task = remote(host, [])
            for n in range(200):
                task.put(b"k%d" % n, b"%d-%d" % (burst, n))
            task.commit(burst)
            time.sleep(0.1)
        # Counted, not seen as table files: RocksDB compacts flushed files together.
        assert host.idle_flushes > 0, "no idle flush happened"
        assert [held.get(b"k%d" % n) for n in (0, 199)] == [b"19-0", b"19-199"]
        assert held.applied_offset() == 19
    finally:
        host.stop()
    with RocksDBReader(table) as reader:
        assert reader.get(b"k7") == b"19-7" and reader.applied_offset() == 19


def test_a_stopped_partition_refuses_tasks_but_not_lookups_until_it_is_held_again(
    host: StoreHost,
) -> None:
    committed(host, b"a", b"1", 3)
    call_host(host.address, host.authkey, ("stop", "kv", 0, 4, "ValueError: no"))
    assert host.stopped() == {("kv", 0): PartitionStop(4, "ValueError: no")}
    with pytest.raises(PartitionClosed, match="stopped at offset 4"):
        remote(host, [b"a"])
    held = host.partition("kv", 0)
    assert held is not None and held.get(b"a") == b"1"  # lookups still read it

    host.close([("kv", 0)])
    host.open("kv", 0, identity="t/0", epoch=2)
    assert host.stopped() == {}
    assert remote(host, [b"a"]).get(b"a") == b"1"


def test_a_task_reports_its_poison_records_to_on_poison(tmp_path: Path) -> None:
    reports: list[tuple[str, dict[str, int]]] = []
    host = StoreHost(
        state_dir=tmp_path,
        on_poison=lambda store, outcomes: reports.append((store, dict(outcomes))),
    )
    host.start()
    try:
        report = ("task", "kv", None, {"fold": 0.1}, 7, {"dead_lettered": 2})
        call_host(host.address, host.authkey, report)
        call_host(host.address, host.authkey, ("task", "kv", None, {}, 1, {}))
    finally:
        host.stop()
    assert reports == [("kv", {"dead_lettered": 2})]
