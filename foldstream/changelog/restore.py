"""Restoring a store partition's local copy to the end of its changelog, before it is used."""

from __future__ import annotations

import logging
from pathlib import Path

from foldstream.changelog.follower import ChangelogFollower
from foldstream.changelog.layout import StoreLayout
from foldstream.kafka import read_partitions_to_end
from foldstream.stale_state import open_checked
from foldstream.state import RocksDBWriter

log = logging.getLogger(__name__)


def open_copy(state_dir: Path, store: str, layout: StoreLayout, partition: int) -> RocksDBWriter:
    """Open the local copy of ``store``'s ``partition`` for writing (creating it), unchecked."""
    return layout.local_copy(state_dir, store, partition).open()


def restore(
    *,
    bootstrap: str,
    state_dir: Path,
    store: str,
    layout: StoreLayout,
    partition: int,
    fetch_wait_max_ms: int = 10,
) -> int:
    """Bring the local copy of a partition up to the end of its changelog; returns records read.

    Reads only what the copy lacks (from its changelog offset on). A copy whose directory was
    lost is rebuilt from offset 0 (a compacted changelog holds the latest value of every key).
    A copy that does not belong to its topics (recreated since it was made) is first rebuilt
    or refused, by ``layout.on_stale`` (:func:`foldstream.stale_state.open_checked`).
    """
    copy = layout.local_copy(state_dir, store, partition)
    writer = open_checked(bootstrap, copy, layout.on_stale)
    try:
        start = writer.changelog_offset()
        follower = ChangelogFollower(writer)
        applied = 0
        for batch in read_partitions_to_end(
            bootstrap,
            layout.changelog_topic,
            {partition: 0 if start is None else start + 1},
            fetch_wait_max_ms=fetch_wait_max_ms,
        ):
            applied += follower.feed(batch)
        follower.settle()
        if follower.foreign:
            log.info("%s: ignored %d records of an older source topic", copy.path, follower.foreign)
        return applied
    finally:
        writer.close()
