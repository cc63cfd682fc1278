"""The index of one partition's keyed commands: which ``Idempotency-Key`` named which applied
command and what it answered, so that a retry within the retention answers the same.

The index lives beside the partition's aggregates (:mod:`.aggregates`). With an aggregate
store, its entries are keys of the same RocksDB partition, written in the same write batch (and
changelog batch) as the snapshots of the same transactions: the index always reaches exactly
the snapshots' position, and a takeover's replay of the events past it rebuilds the rest from
the key header of each keyed event (:mod:`.idempotency`). Without a store the index is in
memory, rebuilt by the replay from offset 0.

An entry answers retries while it is *live*, which depends on the partition's log only, so
every owner, before or after a failover, agrees:

- its time is no more than the retention before the partition's *horizon*, the newest time of
  its keyed commands (each time is the owner's clock when it accepted the command);
- it is among the newest ``max_keys`` keyed commands of the partition.

An entry no longer live is deleted with the next writes (each deletes a bounded number), in
the order the entries were made.

The store layout and the entries: :mod:`.key_entries`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from foldstream.commands.idempotency import (
    MAX_HEADER_BYTES,
    MAX_NAME,
    IdempotencyKeyReused,
    KeyedRequest,
    KeyHeader,
    key_header,
)
from foldstream.commands.key_entries import (
    EXPIRE_PER_WRITE,
    FUTURE_SLACK_MS,
    MAX_ENTRY_BYTES,
    META_KEY,
    Entry,
    IndexWrite,
    MemoryValues,
    Meta,
    Retention,
    Stamp,
    Values,
    Writable,
    entry_key,
    entry_of,
    order_key,
    resolve,
)
from foldstream.commands.outcomes import CommandResult, describe
from foldstream.domain import EventRecord
from foldstream.errors import NotOwner, RecordTooLarge

log = logging.getLogger(__name__)


class KeyIndex:
    """The keyed commands of ``partition`` (see the module), over ``store`` (None: in memory).

    Commands use it from the event loop (:meth:`find`, :meth:`stamp`, :meth:`begin`,
    :meth:`committed`, :meth:`failed`); the partition's writes (:meth:`take`, :meth:`changes`,
    :meth:`written`) and the takeover's replay (:meth:`replayed`) from worker threads.
    """

    def __init__(self, partition: int, store: Values | None, retention: Retention) -> None:
        self.partition = partition
        self.retention = retention
        self.memory = MemoryValues() if store is None else None
        self._store: Values = store if store is not None else self.memory  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._pending: dict[str, Stamp] = {}
        self._unwritten: dict[str, Entry] = {}  # committed, not written yet: they answer too
        self._new: list[Entry] = []  # the same, in log order, for the next write
        self._dropped: set[str] = set()  # keys whose entry a replay found incomplete
        self._written = self._stored_meta()
        self._next, self._horizon = self._written.next, self._written.horizon
        self.closed = False

    # -- commands (on the event loop) ---------------------------------------------------------

    def find(self, keyed: KeyedRequest) -> CommandResult | asyncio.Future[None] | None:
        """The outcome of the command ``keyed.key`` named, if it was applied and is live; the
        future of its attempt still in flight; or None (run the command).
        :class:`IdempotencyKeyReused` if the key named another request."""
        with self._lock:
            if self.closed:
                raise NotOwner(self.partition, "was released by this instance")
            stamp = self._pending.get(keyed.key)
            if stamp is not None:
                first = stamp.request
                if first.request != keyed.request:
                    detail = keyed.conflict(first.aggregate, first.aggregate_id, first.command)
                    raise IdempotencyKeyReused(keyed.key, detail)
                assert stamp.done is not None
                return stamp.done
            entry = self._unwritten.get(keyed.key)
            now = Meta(next=self._next, horizon=self._horizon)
        if entry is None:
            entry = self._read(keyed.key)  # a RocksDB get, as a snapshot read on a cache miss
        if entry is None or not self._live(entry, now):
            return None
        if entry.request != keyed.request:
            detail = keyed.conflict(entry.aggregate, entry.aggregate_id, entry.command)
            raise IdempotencyKeyReused(keyed.key, detail)
        return CommandResult(entry.events, self.partition, entry.offset, remembered=True)

    def stamp(self, keyed: KeyedRequest, events: list[dict[str, Any]]) -> Stamp:
        """The stamp of ``keyed`` accepted now with ``events`` (as its answer lists them);
        :class:`RecordTooLarge` if its entry would be larger than :data:`MAX_ENTRY_BYTES`."""
        at = int(time.time() * 1000)
        stamp = Stamp(keyed, at, events, keyed.header(at))
        names = max(len(keyed.aggregate), len(keyed.command))
        if names > MAX_NAME or len(stamp.header) > MAX_HEADER_BYTES:  # no replay would read it
            raise RecordTooLarge(
                f"the names of {keyed.aggregate!r} and {keyed.command!r} are too long to keep "
                f"with an Idempotency-Key ({MAX_NAME} characters at most): send the command "
                "without a key, or rename them"
            )
        size = len(entry_of(stamp, 0, 0).model_dump_json())
        if size > MAX_ENTRY_BYTES:
            raise RecordTooLarge(
                f"the answer of this command would take {size} bytes to keep for retries of its "
                f"{keyed.key!r} (Idempotency-Key); at most {MAX_ENTRY_BYTES}. Nothing was "
                "appended: send it without the key, or split it"
            )
        return stamp

    def begin(self, stamp: Stamp) -> None:
        """``stamp``'s command is queued: a retry meanwhile waits for its transaction."""
        stamp.done = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending[stamp.request.key] = stamp

    def committed(self, keyed: Iterable[tuple[Stamp, int]]) -> None:
        """The transaction of these keyed commands (each with its last event's offset)
        committed: they answer retries from now on."""
        with self._lock:
            for stamp, offset in keyed:
                if not self.closed:
                    self._add(entry_of(stamp, self._next, offset))
                self._settle(stamp)

    def failed(self, stamps: Iterable[Stamp]) -> None:
        """The transaction of these keyed commands failed: a retry looks again."""
        with self._lock:
            for stamp in stamps:
                self._settle(stamp)

    def _settle(self, stamp: Stamp) -> None:
        key = stamp.request.key
        if self._pending.get(key) is stamp:
            del self._pending[key]
        if stamp.done is not None:
            resolve(stamp.done)

    def _add(self, entry: Entry) -> None:
        self._next = max(self._next, entry.seq + 1)
        latest = int(time.time() * 1000) + FUTURE_SLACK_MS
        self._horizon = max(self._horizon, min(entry.at, latest))
        self._unwritten[entry.key] = entry
        self._new.append(entry)

    # -- writes (in the partition's writing thread) -------------------------------------------

    def has_new(self) -> bool:
        return bool(self._new or self._dropped) and not self.closed

    def take(self) -> IndexWrite | None:
        """The entries committed since the last write, for the next one (its changes are
        made by :meth:`changes`); None when there is nothing to write."""
        with self._lock:
            entries, self._new = self._new, []
            dropped, self._dropped = self._dropped, set()
            meta = Meta(next=self._next, first=self._written.first, horizon=self._horizon)
        return IndexWrite(entries, dropped, meta) if entries or dropped else None

    def changes(self, write: IndexWrite) -> dict[bytes, bytes | None]:
        """What ``write`` changes in the store: its entries added, and those no longer live
        deleted (:data:`EXPIRE_PER_WRITE` more than it adds at most, oldest first)."""
        changes: dict[bytes, bytes | None] = {entry_key(key): None for key in write.dropped}
        for entry in write.entries:
            changes[entry_key(entry.key)] = entry.model_dump_json().encode()
            changes[order_key(entry.seq)] = entry.key.encode()
        meta = write.meta
        meta.first = self._expire(changes, meta, EXPIRE_PER_WRITE + len(write.entries))
        changes[META_KEY] = meta.model_dump_json().encode()
        return changes

    def _expire(self, changes: dict[bytes, bytes | None], meta: Meta, budget: int) -> int:
        """Delete (in ``changes``) the entries no longer live, oldest first; the new ``first``."""
        first = meta.first
        while first < meta.next and budget > 0:
            named = self._value(changes, order_key(first))
            if named is not None:
                key = named.decode(errors="replace")
                entry = self._entry_in(changes, key)
                if entry is not None and entry.seq == first:
                    if self._live(entry, meta):
                        break
                    changes[entry_key(key)] = None
                # Dead, or its key was used again since: a newer entry holds it.
                changes[order_key(first)] = None
            first += 1
            budget -= 1
        return first

    def write(
        self,
        store: Writable,
        changes: dict[bytes, bytes | None],
        offset: int,
        keyed: IndexWrite | None,
    ) -> None:
        """Write ``changes`` and ``keyed``'s (from :meth:`take`) in one write batch of
        ``store``, as the state after the event at ``offset``."""
        try:
            if keyed is not None:
                changes = changes | self.changes(keyed)
            store.write(changes, offset)
        except BaseException:
            if keyed is not None:
                self.unwritten(keyed)
            raise
        if keyed is not None:
            self.written(keyed)

    def written(self, write: IndexWrite) -> None:
        """``write`` is in the store: its entries answer from there."""
        with self._lock:
            self._written = write.meta
            for entry in write.entries:
                key = entry.key
                if self._unwritten.get(key) is entry:
                    del self._unwritten[key]

    def unwritten(self, write: IndexWrite) -> None:
        """``write`` failed: its entries go with the next one."""
        with self._lock:
            self._new = write.entries + self._new
            self._dropped |= write.dropped

    def write_in_memory(self) -> None:
        """Without a store: apply the next write at once."""
        write = self.take()
        if write is not None and self.memory is not None:
            self.memory.write(self.changes(write))
            self.written(write)

    def close(self) -> None:
        """Drop what is not written; a retry waiting for an attempt in flight looks again."""
        with self._lock:
            self.closed = True
            pending = list(self._pending.values())
            self._pending.clear()
            self._unwritten.clear()
            self._new.clear()
        for stamp in pending:
            if stamp.done is not None:
                resolve(stamp.done)

    # -- replay (in the thread taking the partition over) -------------------------------------

    def replayed(self, record: EventRecord, offset: int, event: Any) -> None:
        """The replay applied ``event``, of ``record`` at ``offset``: index its key, if it has
        one (the events of one command are consecutive records carrying the same header). A
        key that cannot be indexed so is left out, logged: never an entry answering wrong."""
        header = key_header(record)
        if header is None or record.key is None:
            return
        try:
            entry = self._replayed_entry(header, record.key.decode(), offset, event)
        except Exception as exc:  # noqa: BLE001 - one record never stops a replay
            log.warning("partition %d offset %d: key not indexed (%s)", self.partition, offset, exc)
            entry = None
        if entry is None or len(entry.model_dump_json()) > MAX_ENTRY_BYTES:
            self.replay_failed(record)  # no owner writes such an entry: a forged record
            return
        with self._lock:
            self._add(entry)

    def _replayed_entry(
        self, header: KeyHeader, aggregate_id: str, offset: int, event: Any
    ) -> Entry | None:
        """The entry of ``header``'s key once ``event`` (at ``offset``) is applied: a new one,
        or the one of the same command extended by ``event``."""
        with self._lock:  # only the replay changes the index meanwhile
            current = self._unwritten.get(header.key)
            seq = self._next
        if current is None:
            current = self._read(header.key)
        (described,) = describe([event])
        if current and current.offset == offset - 1 and current.request == header.request:
            events = [*current.events, described]
            return current.model_copy(update={"offset": offset, "events": events})
        return Entry(
            key=header.key,
            request=header.request,
            aggregate=header.aggregate,
            aggregate_id=aggregate_id,
            command=header.command,
            at=header.at,
            seq=seq,
            offset=offset,
            events=[described],
        )

    def replay_failed(self, record: EventRecord) -> None:
        """An event of ``record`` could not be applied: its command's entry, if it has a key, is
        not kept (it would answer a retry with part of the command's events)."""
        header = key_header(record)
        if header is None:
            return
        with self._lock:
            self._unwritten.pop(header.key, None)
            self._new = [e for e in self._new if e.key != header.key]
            self._dropped.add(header.key)

    # -- reading ------------------------------------------------------------------------------

    def _live(self, entry: Entry, meta: Meta) -> bool:
        retention = self.retention
        return (
            entry.at >= meta.horizon - retention.seconds * 1000
            and entry.seq >= meta.next - retention.max_keys
        )

    def _stored_meta(self) -> Meta:
        (raw,) = self._store.get_many([META_KEY])
        if raw is None:
            return Meta()
        try:
            return Meta.model_validate_json(raw)
        except ValidationError:
            log.warning(
                "partition %d: the idempotency index's bookkeeping does not parse: "
                "restarted empty (keys of commands written before are forgotten)",
                self.partition,
            )
            return Meta()

    def _read(self, key: str) -> Entry | None:
        (raw,) = self._store.get_many([entry_key(key)])
        return None if raw is None else self._parse(raw)

    def _parse(self, raw: bytes) -> Entry | None:
        try:
            return Entry.model_validate_json(raw)
        except ValidationError:
            log.warning(
                "partition %d: an idempotency entry does not parse: ignored", self.partition
            )
            return None

    def _value(self, changes: dict[bytes, bytes | None], key: bytes) -> bytes | None:
        if key in changes:
            return changes[key]
        (value,) = self._store.get_many([key])
        return value

    def _entry_in(self, changes: dict[bytes, bytes | None], key: str) -> Entry | None:
        raw = self._value(changes, entry_key(key))
        return None if raw is None else self._parse(raw)
