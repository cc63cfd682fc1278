"""Applying one partition's changelog records to a local copy, a whole batch at a time, fenced
against previous owners and earlier source topics (the headers: :mod:`foldstream.changelog`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from foldstream.changelog.records import (
    BATCH_END_HEADER,
    EPOCH_HEADER,
    FOLDED_FROM_HEADER,
    SOURCE_ID_HEADER,
    SOURCE_OFFSET_HEADER,
)
from foldstream.state import RocksDBWriter


class ChangelogFollower:
    """Applies one partition's changelog records to a local copy, one whole batch at a time.

    A projection marks a batch's last record with :data:`BATCH_END_HEADER` (and its first
    with :data:`BATCH_START_HEADER`, which copies of earlier versions required). A batch is
    applied once closed: by its last record, or by the next batch when that one was folded from
    the source offset the batch reached. Compaction keeps only each key's newest record, so it
    removes many first and last records: a batch is applied whether or not its first record is
    there. Records of a batch cut short (its writer died or its task failed mid-batch) are
    dropped when the next batch starts, and so is the rest of the batch a copy stopped inside of
    (:meth:`settle` records which). A copy therefore never holds values ahead of the source
    offset it records. Records at or below the copy's changelog offset are skipped, so
    re-reading is harmless.

    Fencing: records of an epoch below the newest one seen (kept with the copy) are ignored,
    and a closed batch whose source offset the copy has already reached only moves its
    changelog offset: a previous owner's late writes can neither interrupt the current
    owner's batches nor take the copy's values back to an older source offset. Records folded
    from another source topic than the copy's (an earlier one of the same name, by their
    :data:`SOURCE_ID_HEADER`) are ignored too.
    """

    def __init__(self, writer: RocksDBWriter) -> None:
        self.writer = writer
        self._pending: list[Any] = []
        self._batch: bytes | None = None
        self._collecting = False  # collecting the current batch's records to apply it
        self._open = False  # the current batch has not been closed yet
        self._epoch = writer.changelog_epoch()
        # The batch the copy's position is inside of: its records before it were not applied.
        self._unfinished = writer.unfinished_batch()
        self._read: int | None = None  # the last changelog offset read
        self.fenced = 0  # records ignored as a previous owner's
        self.malformed = 0  # records ignored because their headers are not a projection's
        source_id = writer.topic_ids()[0]
        self._source_id = None if source_id is None else source_id.encode()
        self.foreign = 0  # records ignored as folded from an earlier source topic

    def feed(self, messages: Iterable[Any]) -> int:
        """Apply every closed batch in ``messages``; returns records applied."""
        applied = 0
        done = self.writer.changelog_offset()
        for message in messages:
            if done is not None and message.offset() <= done:
                continue
            self._read = message.offset()
            headers = dict(message.headers() or ())
            if self._foreign(headers.get(SOURCE_ID_HEADER)):
                self.foreign += 1
                continue
            epoch = _valid_headers(headers)
            if epoch is None:
                self.malformed += 1  # not written by a projection: nothing to apply
                continue
            if epoch < self._epoch:
                self.fenced += 1
                continue
            batch = headers.get(SOURCE_OFFSET_HEADER)
            if epoch > self._epoch or batch != self._batch:
                if self._closed_by(headers.get(FOLDED_FROM_HEADER)):
                    applied += self._apply(int(self._batch), self._pending[-1].offset())  # type: ignore[arg-type]
                self._pending.clear()
                self._epoch, self._batch = epoch, batch
                self._open = True
                # Whether or not compaction left its first record: a batch is read from its
                # start unless the copy stopped inside it.
                self._collecting = _batch_id(epoch, batch) != self._unfinished
            if not self._collecting:
                continue
            self._pending.append(message)
            if BATCH_END_HEADER in headers and batch is not None:
                applied += self._apply(int(batch), message.offset())
                self._collecting = self._open = False
        return applied

    def _foreign(self, source_id: bytes | None) -> bool:
        """Whether a record folded from the source topic ``source_id`` is of another topic
        than the copy's (unknown ids are no evidence)."""
        return None not in (source_id, self._source_id) and source_id != self._source_id

    def _closed_by(self, folded_from: bytes | None) -> bool:
        """Whether the unclosed batch being collected is complete, as shown by the next
        batch's writer having folded from its source offset or beyond: its closing record was
        compacted away. Folded from before it, the next batch shows it cut short (a failed
        task, a writer that died): that writer folds the same events again from there."""
        return (
            self._collecting
            and bool(self._pending)
            and folded_from is not None
            and self._batch is not None
            and int(folded_from) >= int(self._batch)
        )

    def settle(self) -> None:
        """Record what was read after the last applied batch as seen: the copy's changelog
        position moves past it and its epoch to the newest read.

        For a copy that stops following here (a takeover): the rest of an unclosed batch read
        is then dropped by whoever follows from this position, and the next writer's epoch,
        above the copy's, is above every epoch the changelog held.
        """
        done = self.writer.changelog_offset()
        if self._read is not None and (done is None or self._read > done):
            unfinished = _batch_id(self._epoch, self._batch) if self._open else None
            self.writer.note_changelog(self._read, self._epoch, unfinished)
        self._pending.clear()
        self._collecting = False

    def _apply(self, source_offset: int, changelog_offset: int) -> int:
        reached = self.writer.applied_offset()
        applied = 0  # a stale batch (values older than the copy's) only moves the position
        if reached is None or source_offset > reached:
            for record in self._pending:
                if record.value() is None:
                    self.writer.delete(record.key())
                else:
                    self.writer.put(record.key(), record.value())
            reached, applied = source_offset, len(self._pending)
        self.writer.commit(reached, changelog_offset=changelog_offset, changelog_epoch=self._epoch)
        self._pending.clear()
        return applied


_DECIMAL = re.compile(rb"-?[0-9]{1,19}")


def _valid_headers(headers: Mapping[str, bytes | None]) -> int | None:
    """The epoch of a changelog record whose foldstream headers are well formed (decimal
    numbers where numbers go), else None: anything can be written to a topic."""
    numbers = [
        headers.get(name) for name in (EPOCH_HEADER, SOURCE_OFFSET_HEADER, FOLDED_FROM_HEADER)
    ]
    if any(n is not None and not _DECIMAL.fullmatch(n) for n in numbers):
        return None
    return int(numbers[0] or 0)


def _batch_id(epoch: int, batch: bytes | None) -> bytes:
    return b"%d:%s" % (epoch, batch or b"")
