"""How a task folds a store of a multi-stage graph: a store others read the changes of (it
forwards them, :mod:`.emit`), a multi-input store (it skips what it applied already,
:mod:`.dedup`), or a hidden forwarder (it only forwards events, :func:`forward_and_send`).

Stores of none of these kinds fold as before, without any of it
(:func:`~foldstream.projections.fold.fold_and_send` without a stage).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard

from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable, UndecodableRecord
from foldstream.projections.chunks import Records, not_applied
from foldstream.projections.dedup import APPLY, Marks, mark_key, origins_of
from foldstream.projections.emit import Emitter, Pending, targets_of
from foldstream.projections.forwarded import PROGRESS_KEY, RESERVED, Forwarded, parse_forwarded
from foldstream.projections.graph import Forwarder
from foldstream.projections.joins import Join
from foldstream.projections.poison import Apply, PoisonPolicy
from foldstream.projections.projection import Projection
from foldstream.projections.task_output import (
    ChangelogTarget,
    Folded,
    send_changes,
)
from foldstream.state import PartitionWriter

log = logging.getLogger(__name__)

RESERVED_KEY = "keys starting with a NUL byte are reserved for foldstream's bookkeeping"


class Stage:
    """One chunk of one partition of a staged store: its marks (a multi-input store), its
    forwarding (a store others read), and the hooks :func:`fold_and_send` calls."""

    def __init__(
        self,
        projection: Projection,
        emitter: Emitter | None,
        producer: Any,
    ) -> None:
        self.projection = projection
        self.emitter = emitter
        self.producer = producer
        self.dedup = isinstance(projection, Join)
        self.marks: Marks | None = None
        self.offset = -1
        self._forwarded: Forwarded | None = None
        self._pending: list[Pending] = []

    def keys(self, records: Records) -> list[bytes]:
        """The keys the chunk reads: its records' (a forwarder reads none), and the reserved
        keys of its marks and cursors."""
        keys: list[bytes] = []
        if not isinstance(self.projection, Forwarder):
            keys = list(dict.fromkeys(r.key for _, r in records if r.key is not None))
        if self.dedup:
            keys += [mark_key(origin) for origin in origins_of(r for _, r in records)]
        if self.emitter is not None:
            keys += self.emitter.keys()
        return keys

    def fold(
        self,
        writer: PartitionWriter,
        records: Records,
        changelog: ChangelogTarget | None,
        poison: PoisonPolicy | None,
    ) -> Folded | None:
        """Fold the chunk (uncommitted), its forwarded records queued with its changelog's."""
        from foldstream.projections.fold import fold_and_send

        if isinstance(self.projection, Forwarder):
            return forward_and_send(self, writer, records, changelog, poison)
        return fold_and_send(self.projection, writer, records, changelog, poison, stage=self)

    # -- the hooks of fold_and_send ----------------------------------------------------------

    def load(self, get: Callable[[bytes], bytes | None]) -> None:
        """Read the marks and cursors (prefetched with the chunk's keys)."""
        if self.dedup:
            self.marks = Marks(get)
        if self.emitter is not None:
            self.emitter.load(get)

    def admit(self, offset: int, record: EventRecord) -> bool:
        """Whether to fold the record at ``offset``: False for a forwarded record applied
        already or sent after a gap (moved past without folding)."""
        self.offset, self._forwarded, self._pending = offset, None, []
        if self.marks is None:
            return True
        try:
            forwarded = parse_forwarded(record)
        except UndecodableRecord:
            return True  # its fold raises the same: a poison record
        if self.marks.verdict(forwarded) != APPLY:
            return False
        self._forwarded = forwarded
        return True

    def wrap(self, apply: Apply) -> Apply:
        """``apply``, refusing reserved keys and computing what the record forwards (a record
        error of either is the record's, as a fold's)."""
        emitter = self.emitter
        join = self.projection if _applies_forwarded(self.projection, apply) else None

        def staged(current: bytes | None, record: EventRecord) -> bytes | None:
            key = record.key
            if key is not None and key.startswith(RESERVED):
                raise UndecodableRecord(RESERVED_KEY)
            if join is not None and self._forwarded is not None:
                new_value = join.apply_forwarded(current, record, self._forwarded)
            else:
                new_value = apply(current, record)
            if emitter is not None and key is not None:
                self._pending = emitter.changes(key, current, new_value, self.offset)
            return new_value

        return staged

    def folded(self, folded: Folded, record: EventRecord) -> None:
        """The record's new value is written: move its mark, send what it forwards."""
        if self._forwarded is not None and self.marks is not None:
            self.marks.advance(self._forwarded)
        if self._pending and self.emitter is not None and record.key is not None:
            self.emitter.send(
                self.producer, self.offset, record.key, self._pending, folded.on_delivery
            )
            folded.forwarded = self.producer

    def passed(self) -> None:
        """The record was a poison record its store's policy moved past."""
        if self._forwarded is not None and self.marks is not None:
            self.marks.advance(self._forwarded)
        self._pending = []

    def finish(self, writer: PartitionWriter) -> dict[bytes, bytes | None]:
        """Write the moved marks and cursors; returns them (for the changelog)."""
        written: dict[bytes, bytes | None] = {}
        if self.marks is not None:
            written.update(self.marks.written())
            _report_skipped(self.projection.store, self.marks)
        if self.emitter is not None:
            written.update(self.emitter.written())
        for key, value in written.items():
            writer.put(key, value)  # type: ignore[arg-type]  # never None here
        return written


def _applies_forwarded(projection: Projection, apply: Apply) -> TypeGuard[Join]:
    """Whether ``apply`` is ``projection``'s own :meth:`Join.apply`, which the task may call
    as :meth:`Join.apply_forwarded` with the headers :meth:`Stage.admit` parsed already."""
    return (
        isinstance(projection, Join)
        and type(projection).apply is Join.apply
        and apply == projection.apply
    )


def _report_skipped(store: str, marks: Marks) -> None:
    if marks.duplicates:
        log.info(
            "store %s skipped %d forwarded records it had applied already (sent again by a "
            "retried or earlier task)",
            store,
            marks.duplicates,
        )
    if marks.early:
        log.warning(
            "store %s skipped %d forwarded records sent after a record it has not received; "
            "their sender's retry sends them again",
            store,
            marks.early,
        )


def forward_and_send(
    stage: Stage,
    writer: PartitionWriter,
    records: Records,
    changelog: ChangelogTarget | None,
    poison: PoisonPolicy | None,
) -> Folded | None:
    """A hidden forwarder's chunk: forward the events of ``records`` not forwarded yet, and
    write its progress (the source offset reached, in a reserved key, so that its changelog
    carries it to standbys and restores) and cursors; None when all were forwarded already.
    Poison records follow ``poison`` as in :func:`~foldstream.projections.fold.fold_and_send`.
    """
    from foldstream.projections.fold import retry_or_handle

    emitter = stage.emitter
    assert emitter is not None
    applied_offset = writer.applied_offset()
    fresh = not_applied(records, applied_offset)
    if not fresh:
        return None
    emitter.load(writer.get)
    folded = Folded(writer, changelog)

    def compute(current: bytes | None, record: EventRecord) -> bytes | None:
        stage._pending = emitter.events(record, stage.offset)
        return None

    applied, last_offset = 0, None
    for offset, record in fresh:
        stage.offset = offset
        try:
            compute(None, record)
        except BrokerUnavailable:
            raise
        except Exception as error:
            if poison is None:
                raise
            _, poisoned = retry_or_handle(folded, poison, compute, offset, record, None, error)
            if poisoned:
                if folded.stop is not None:
                    break
                applied, last_offset = applied + 1, offset
                continue
        if stage._pending and record.key is not None:
            emitter.send(stage.producer, offset, record.key, stage._pending, folded.on_delivery)
            folded.forwarded = stage.producer
        applied, last_offset = applied + 1, offset
    folded.applied, folded.last_offset = applied, last_offset
    if last_offset is not None:
        changed: dict[bytes, bytes | None] = {PROGRESS_KEY: b"%d" % last_offset}
        changed.update(emitter.written())
        for key, value in changed.items():
            writer.put(key, value)  # type: ignore[arg-type]  # never None here
        if changelog is not None:
            send_changes(folded, changelog, changed, applied_offset)
    return folded


class Staging:
    """What a task of a staged store needs for each chunk: the targets it forwards to and its
    producer. :meth:`of` is None for a store of none of the staged kinds."""

    def __init__(
        self, projection: Projection, emits: Sequence[Any], topic: str, producer: Any
    ) -> None:
        self.projection = projection
        self.targets = list(emits)
        self.topic = topic
        self.producer = producer

    @classmethod
    def of(
        cls,
        options: Mapping[str, str],
        projection: Projection,
        projections: Sequence[Projection],
        producer: Any,
    ) -> Staging | None:
        targets = targets_of(projections, projection.store, options.get("forwards", "{}"))
        if not targets and not isinstance(projection, Join | Forwarder):
            return None
        if targets and producer is None:
            raise ValueError(f"store {projection.store!r} forwards records: it needs a producer")
        return cls(projection, targets, options.get("topic", ""), producer)

    def stage(self, partition: int) -> Stage:
        emitter = None
        if self.targets:
            emitter = Emitter(self.projection.store, self.topic, partition, self.targets)
        return Stage(self.projection, emitter, self.producer)
