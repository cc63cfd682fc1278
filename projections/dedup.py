"""Exactly once across two stages: a multi-input store applies each forwarded record once.

Forwarding is at least once. A stage-1 task (the emitting store's) sends its chunk's forwarded
records with its changelog records and commits only once all are acknowledged; a task retried
after a failure, a crash or a move sends again what it sent after its store's last commit, and a
paused former owner may send late. Forwarded records are not written in Kafka transactions
(Spark does not pin a store partition's tasks to one worker: each switch would pay a fencing
round trip, every chunk a transaction's). Instead:

- every forwarded record carries its *origin* ``O`` (the emitting store, and the topic and
  partition it folds), its *position* ``(source offset, sequence number)`` and ``prev``, the
  position of the record the emitter sent before it from ``O`` to the same repartition
  partition (:mod:`.forwarded`); the emitter keeps, per repartition partition, the position
  of its last record there (its *cursor*) in its own store partition, written with its
  values and source offset in one write batch (:mod:`.emit`);
- the multi-input store keeps, per origin, the position of the last record it applied (its
  *mark*) in its own partition, in the write batch of the values it changed (so in its
  changelog, and in every copy restored or kept from it);
- a record at or below its origin's mark is a duplicate: skipped. A record whose ``prev`` is
  above the mark follows a record not applied yet: skipped too (it is sent again, see below).
  Any other record is folded and its position becomes the mark (also when it is a poison
  record that the store's policy moved past).

Why this applies every record exactly once. Folds are deterministic, and the emitting store is
exactly once, so for each origin ``O`` and repartition partition ``r`` there is one sequence
``F`` of records an emitter ever sends from ``O`` to ``r``, ordered by position, whatever task
sends them; ``prev`` of each is its predecessor in ``F`` (the cursors are read from the state
the task resumes from, so a task restarting at a committed offset continues ``F`` exactly).
By induction along ``F``: suppose every record of ``F`` before ``f`` was applied once and the
mark is ``prev(f)``. ``f`` itself is applied at its first copy read, since its ``prev`` equals
the mark (it cannot be read before ``prev(f)`` was applied: its ``prev`` would be above the
mark, and that copy is skipped), and every later copy is at or below the new mark. And ``f`` is
read at all: its offset is eventually committed by the emitting store, by a task whose sends
after its starting point were all acknowledged, in order (one idempotent producer), so a copy
of ``f`` follows a copy of every earlier record of ``F`` in ``r``. Records sent with a gap
before them (a lost send whose task then failed before committing) are skipped until a retry
sends the gap and them again; a zombie's late records are copies of records of ``F``.

When folds are not deterministic across a deployment (a changed ``group_by``), a record
whose ``prev`` is below the mark is still applied: a new version's records never wait forever
for a predecessor the old version never sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from foldstream.domain.records import EventRecord
from foldstream.errors import UndecodableRecord
from foldstream.projections.forwarded import (
    RESERVED,
    Forwarded,
    Origin,
    Position,
    origin_fields,
    parse_forwarded,
    parse_position,
    position_bytes,
)

log = logging.getLogger(__name__)

APPLY, DUPLICATE, EARLY = "apply", "duplicate", "early"


def mark_key(origin: Origin) -> bytes:
    """The reserved key of ``origin``'s mark in a multi-input store's partition."""
    return b"%smark\x00%s\x00%s\x00%d" % (
        RESERVED,
        origin.emitter.encode(),
        origin.topic.encode(),
        origin.partition,
    )


def origins_of(records: Iterable[EventRecord]) -> list[Origin]:
    """The origins of the forwarded records among ``records`` (malformed ones left out), whose
    marks a chunk reads ahead.

    Records naming the origin fields of a record parsed already are not parsed again (a
    chunk's records come from a few origins): only which marks are read ahead depends on it,
    and a mark not read ahead is read when first needed (:meth:`Marks.mark`).
    """
    found: dict[Origin, None] = {}
    seen: set[bytes] = set()
    for record in records:
        named = origin_fields(record)
        if named is None or named in seen:
            continue  # no header (a poison record: its fold raises), or its origin is found
        try:
            found.setdefault(parse_forwarded(record).origin)
        except UndecodableRecord:
            continue  # a poison record: its fold raises the same error
        seen.add(named)
    return list(found)


class Marks:
    """The marks of one chunk of a multi-input store's partition: read from the partition
    through ``get`` (prefetched with the chunk's keys), moved as records are applied, written
    with the chunk (:meth:`written`)."""

    def __init__(self, get: Callable[[bytes], bytes | None]) -> None:
        self._get = get
        self._marks: dict[Origin, Position | None] = {}
        self._moved: set[Origin] = set()
        self.duplicates = 0
        self.early = 0

    def mark(self, origin: Origin) -> Position | None:
        if origin not in self._marks:
            raw = self._get(mark_key(origin))
            self._marks[origin] = None if raw is None else parse_position(raw.decode())
        return self._marks[origin]

    def verdict(self, forwarded: Forwarded) -> str:
        """:data:`APPLY`, :data:`DUPLICATE` (applied already) or :data:`EARLY` (a record
        before it was not applied yet)."""
        mark = self.mark(forwarded.origin)
        if mark is not None and forwarded.position <= mark:
            self.duplicates += 1
            return DUPLICATE
        if forwarded.prev is not None and (mark is None or forwarded.prev > mark):
            self.early += 1
            return EARLY
        return APPLY

    def advance(self, forwarded: Forwarded) -> None:
        """``forwarded`` was applied (or moved past as a poison record)."""
        self._marks[forwarded.origin] = forwarded.position
        self._moved.add(forwarded.origin)

    def written(self) -> dict[bytes, bytes]:
        """The marks that moved, as the reserved keys and values to write."""
        return {
            mark_key(origin): position_bytes(position)
            for origin in self._moved
            if (position := self._marks[origin]) is not None
        }
