"""Local copies of store partitions that no longer belong to the topics they read: found before
they are used, then rebuilt (or refused).

Every copy is checked where it is opened for use: at startup (:func:`check_local_copies`, every
copy in the state directory), when it is restored for a takeover and when it is opened as a
standby (:func:`open_checked`, from :mod:`foldstream.changelog`). The decision is
:func:`foldstream.state.validity.judge`; this module gathers what it needs from the broker (the
topics' ids, whether the copy's next offsets lie within them) and acts on it, by the instance's
``on_stale_state`` setting:

- ``rebuild`` (the default): one warning line naming the store, the partition and why; the copy
  is discarded and rebuilt from the topics: from the changelog when it is whole, else from the
  source topic.
- ``refuse``: :class:`~foldstream.errors.StaleState`, naming the state directory and the fix
  (the CLI prints it as one ``error:`` line).

A changelog is not whole when the source topic was recreated but the changelog was not: it holds
values folded from the earlier source topic. Every changelog record says which source topic
(its id, header :data:`SOURCE_ID_HEADER`) its value was folded from, and copies apply only
records of the topic they read. Records without it (written by an earlier foldstream, or where
the broker has no topic ids) cannot be told apart: such a changelog must be deleted, which
:class:`~foldstream.errors.StaleState` says whatever the setting.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from foldstream.end_probes import positions_within
from foldstream.errors import StaleState
from foldstream.kafka import read_partitions_to_end, topic_ids
from foldstream.settings import OnStaleState
from foldstream.state import RocksDBWriter, discard_partition, partition_path
from foldstream.state.format import TABLE_FORMAT
from foldstream.state.rocksdb import is_lock_held
from foldstream.state.validity import Observed, Recorded, Verdict, judge

#: The id of the source topic a changelog record's value was folded from.
SOURCE_ID_HEADER = "foldstream-source-id"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalCopy:
    """The local copy of ``store``'s ``partition`` under ``state_dir``, its topics, the
    format it is kept in and whether its files are read through ``mmap``."""

    state_dir: Path
    store: str
    partition: int
    source_topic: str
    changelog_topic: str
    table_format: str = TABLE_FORMAT
    mapped_reads: bool = True

    @property
    def path(self) -> Path:
        return partition_path(self.state_dir, self.store, self.partition)

    @property
    def identity(self) -> str:
        return f"{self.source_topic}/{self.partition}"

    def open(self) -> RocksDBWriter:
        return RocksDBWriter(
            self.path,
            identity=self.identity,
            table_format=self.table_format,
            mapped_reads=self.mapped_reads,
        )


def open_checked(bootstrap: str, copy: LocalCopy, on_stale: OnStaleState) -> RocksDBWriter:
    """Open ``copy`` for writing (creating it), once it is known to belong to its topics: a
    copy that does not is rebuilt (discarded and opened empty) or refused, by ``on_stale``.
    The copy is stamped with its topics' ids."""
    writer = copy.open()
    try:
        ids = topic_ids(bootstrap, [copy.source_topic, copy.changelog_topic])
        verdicts = _judge(bootstrap, [(copy, writer)], ids)
    except BaseException:
        writer.close()
        raise
    if copy in verdicts:
        writer.close()
        _settle(bootstrap, copy, verdicts[copy], on_stale, ids)
        writer = copy.open()
    writer.stamp_topic_ids(ids.get(copy.source_topic), ids.get(copy.changelog_topic))
    return writer


def check_local_copies(bootstrap: str, copies: Iterable[LocalCopy], on_stale: OnStaleState) -> int:
    """Check every one of ``copies`` that exists (at startup); returns how many were discarded.

    With ``refuse``, one :class:`StaleState` names them all. A copy another process holds open
    is left for :func:`open_checked` to check when it is used.
    """
    opened: list[tuple[LocalCopy, RocksDBWriter]] = []
    try:
        for copy in copies:
            if (copy.path / "CURRENT").exists() and (writer := _open_unless_held(copy)):
                opened.append((copy, writer))
        topics = {t for copy, _ in opened for t in (copy.source_topic, copy.changelog_topic)}
        ids = topic_ids(bootstrap, topics)
        verdicts = _judge(bootstrap, opened, ids)
        for copy, writer in opened:
            if copy not in verdicts:
                writer.stamp_topic_ids(ids.get(copy.source_topic), ids.get(copy.changelog_topic))
    finally:
        for _, writer in opened:
            writer.close()
    if verdicts and on_stale is OnStaleState.refuse:
        _refuse(list(verdicts.items()))
    for copy, verdict in verdicts.items():
        _settle(bootstrap, copy, verdict, on_stale, ids)
    return len(verdicts)


def _open_unless_held(copy: LocalCopy) -> RocksDBWriter | None:
    try:
        return copy.open()
    except Exception as exc:
        if not is_lock_held(exc):
            raise
        log.warning("%s is held by another process: checked when it is used", copy.path)
        return None


def _judge(
    bootstrap: str, opened: list[tuple[LocalCopy, RocksDBWriter]], ids: dict[str, str | None]
) -> dict[LocalCopy, Verdict]:
    """The verdict on each copy that does not belong to its topics (``ids``: the topics that
    exist, with their ids)."""
    recorded = {copy: _recorded(writer) for copy, writer in opened}
    positions: dict[tuple[str, int], int] = {}
    for copy, stamp in recorded.items():
        source_next, changelog_next = stamp.next_offsets()
        for topic, stamped, offset in (
            (copy.source_topic, stamp.source_id, source_next),
            (copy.changelog_topic, stamp.changelog_id, changelog_next),
        ):
            current = ids.get(topic)
            # A topic known to have been recreated needs no further evidence.
            recreated = None not in (stamped, current) and stamped != current
            if offset is not None and topic in ids and not recreated:
                positions[(topic, copy.partition)] = offset
    within = positions_within(bootstrap, positions)
    verdicts = {}
    for copy, stamp in recorded.items():
        observed = Observed(
            source_id=ids.get(copy.source_topic),
            changelog_id=ids.get(copy.changelog_topic),
            source_offset_within=within.get((copy.source_topic, copy.partition), True),
            changelog_offset_within=within.get((copy.changelog_topic, copy.partition), True),
        )
        verdict = judge(
            stamp,
            observed,
            source=copy.source_topic,
            changelog=copy.changelog_topic,
            partition=copy.partition,
        )
        if verdict is not None:
            verdicts[copy] = verdict
    return verdicts


def _recorded(writer: RocksDBWriter) -> Recorded:
    source_id, changelog_id = writer.topic_ids()
    return Recorded(writer.applied_offset(), writer.changelog_offset(), source_id, changelog_id)


def _refuse(stale: list[tuple[LocalCopy, Verdict]]) -> None:
    copy, verdict = stale[0]
    others = f" (and {len(stale) - 1} more copies)" if len(stale) > 1 else ""
    raise StaleState(
        f"state directory {copy.state_dir} holds a copy of store {copy.store!r} partition "
        f"{copy.partition}{others} that does not belong to the topics it reads: {verdict}. "
        f"Delete {copy.state_dir} to rebuild its stores from the topics, or start with "
        "--on-stale-state rebuild (FOLDSTREAM_ON_STALE_STATE=rebuild) to have such copies "
        "rebuilt"
    )


def _settle(
    bootstrap: str,
    copy: LocalCopy,
    verdict: Verdict,
    on_stale: OnStaleState,
    ids: dict[str, str | None],
) -> None:
    """Refuse ``copy`` or discard it, saying why in one line."""
    if on_stale is OnStaleState.refuse:
        _refuse([(copy, verdict)])
    if verdict.changelog_whole:
        source = (
            f"from {copy.changelog_topic} (what it holds of {copy.source_topic}), then from "
            f"{copy.source_topic}"
        )
    else:
        _require_marked(bootstrap, copy, ids.get(copy.source_topic))
        source = (
            f"from {copy.source_topic} ({copy.changelog_topic} holds values of the earlier "
            "topic, which are ignored)"
        )
    log.warning(
        "store %r partition %d: discarding its local copy %s: %s; rebuilding it %s",
        copy.store,
        copy.partition,
        copy.path,
        verdict,
        source,
    )
    discard_partition(copy.path)


def _require_marked(bootstrap: str, copy: LocalCopy, source_id: str | None) -> None:
    """Raise unless every record of ``copy``'s changelog partition says which source topic it
    was folded from: the changelog outlived its source topic, and a record that does not say
    could be of the earlier one."""
    for batch in read_partitions_to_end(bootstrap, copy.changelog_topic, {copy.partition: 0}):
        for message in batch:
            if source_id is None or SOURCE_ID_HEADER not in dict(message.headers() or ()):
                raise StaleState(
                    f"{copy.changelog_topic}/{copy.partition} holds values folded from an "
                    f"earlier {copy.source_topic} (deleted and created again since) that "
                    "cannot be told from the new topic's: they do not say which topic they "
                    "were folded from (written by an earlier foldstream, or the broker has no "
                    "topic ids). Stop every instance of the service, delete topic "
                    f"{copy.changelog_topic} and start them again: it is filled again from "
                    f"{copy.source_topic}"
                )
