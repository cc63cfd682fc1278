"""Where a store's state comes from: its source and changelog topics, as the changelog's
readers and the cluster's takeovers need them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from foldstream.settings import OnStaleState
from foldstream.stale_state import LocalCopy
from foldstream.state.format import TABLE_FORMAT


@dataclass(frozen=True)
class StoreLayout:
    """Where a store's state comes from: its source topic and its changelog topic; the format
    its partitions are kept in (:mod:`foldstream.state.format`: changelog records carry the
    keys as stored, so copying them needs no other knowledge of the store's kind); what
    becomes of a local copy that does not belong to them (:mod:`foldstream.stale_state`);
    whether it follows its source topic and whether its files are read through ``mmap``."""

    source_topic: str
    changelog_topic: str
    on_stale: OnStaleState = OnStaleState.rebuild
    table_format: str = TABLE_FORMAT
    #: False for the aggregate store: the command side writes it as it appends and replays
    #: past its position on takeover, so its distance from the topic's end (events of another
    #: writer) is nothing its owner has to catch up on.
    follows_source: bool = True
    #: False for the aggregate store: read only on the command side's cache misses, its files
    #: are read without ``mmap`` (:func:`foldstream.state.format.store_options`).
    mapped_reads: bool = True

    def identity(self, partition: int) -> str:
        return f"{self.source_topic}/{partition}"

    def local_copy(self, state_dir: Path, store: str, partition: int) -> LocalCopy:
        return LocalCopy(
            state_dir=Path(state_dir),
            store=store,
            partition=partition,
            source_topic=self.source_topic,
            changelog_topic=self.changelog_topic,
            table_format=self.table_format,
            mapped_reads=self.mapped_reads,
        )
