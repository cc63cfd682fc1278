"""The bench's reference servers read the stores as the instance reads them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bench.servers import await_flushed
from foldstream.state import RocksDBWriter, partition_path
from foldstream.state.host import IDLE_FLUSH_ENTRIES


def test_a_reference_server_opens_the_stores_once_their_writes_were_flushed(
    tmp_path: Path,
) -> None:
    """A read-only open replays the writer's log into a memtable of its own, kept while open:
    the bench waits for the instance's idle flush before a reference opens the stores."""
    writer = RocksDBWriter(partition_path(tmp_path, "s", 0), identity="s/0")
    for n in range(IDLE_FLUSH_ENTRIES):
        writer.put(b"k%d" % n, b"v")
    writer.commit(1)
    flushing = threading.Event()

    def flush_in_a_while() -> None:
        time.sleep(0.5)  # the instance's idle flush, some time after its last write
        flushing.set()
        writer.flush_memtable()

    flusher = threading.Thread(target=flush_in_a_while)
    flusher.start()
    try:
        await_flushed(tmp_path, "s", 1)
        assert flushing.is_set(), "the reference would have opened the unflushed writes"
    finally:
        flusher.join()
        writer.close()
