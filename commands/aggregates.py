"""One partition's aggregates on the command side: a bounded cache in memory over the aggregate
store (:mod:`.snapshot_store`), or, without a store, all of them in memory.

An aggregate is *dirty* from the moment a command changed it until its snapshot is written:
dirty aggregates stay in memory whatever the cache's bound (reading the store would give an
older state). Once written they are *clean*, kept in least-recently-used order and evicted
beyond the partition's share of the instance's :class:`CacheBudget`; a command for an
aggregate not in memory reads its snapshot from the store (a RocksDB get on the held
partition).

Snapshots are written after the transaction of their events committed (:meth:`committed`,
then :meth:`write_committed` in a worker thread): a crash in between is harmless, the next
takeover replays the events past the snapshots' position. The snapshots of several
transactions are written together, each aggregate's newest once, with the offset of the last
event they reflect. A replay (:mod:`.replay`) writes the aggregates it rebuilt every
:data:`REPLAY_FLUSH` aggregates and when it ends (:meth:`checkpoint`, :meth:`finish`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from foldstream.commands.key_entries import Retention, Stamp
from foldstream.commands.key_index import KeyIndex
from foldstream.commands.snapshot_store import MAX_SNAPSHOT_BYTES, SnapshotPartition
from foldstream.commands.unreplayable import (
    INDEX_KEY,
    AggregateUnreplayable,
    Broken,
    decode_index,
    decode_marker,
    encode_index,
    is_marker,
)
from foldstream.domain import Aggregate
from foldstream.domain.snapshots import SnapshotCodec, UndecodableSnapshot, UnstorableAggregate
from foldstream.errors import RecordTooLarge

log = logging.getLogger(__name__)
#: Aggregates an instance keeps in memory by default (an inventory ``Product`` takes about
#: 360 bytes; see docs/concepts/aggregate-store.md).
DEFAULT_CACHE_SIZE = 100_000
#: A replay writes the aggregates it rebuilt once this many are waiting (or its cache share).
REPLAY_FLUSH = 20_000
#: ``(generation, snapshot)`` of an aggregate a command changed.
Staged = tuple[int, bytes]


class CacheBudget:
    """The aggregates an instance keeps in memory (clean ones), shared by its partitions."""

    def __init__(self, total: int = DEFAULT_CACHE_SIZE) -> None:
        self.total = max(1, total)
        self._partitions = 0
        self._lock = threading.Lock()

    def join(self) -> None:
        with self._lock:
            self._partitions += 1

    def leave(self) -> None:
        with self._lock:
            self._partitions = max(0, self._partitions - 1)

    def share(self) -> int:
        return max(1, self.total // max(1, self._partitions))


class PartitionAggregates:
    """The aggregates of events partition ``partition``: in memory and, with ``store``, as
    snapshots in the aggregate store (see the module), and the index of its keyed commands
    (``keys``, written with the snapshots: :mod:`.key_index`)."""

    def __init__(
        self,
        partition: int,
        codec: SnapshotCodec,
        store: SnapshotPartition | None = None,
        budget: CacheBudget | None = None,
        retention: Retention | None = None,
    ) -> None:
        self.partition = partition
        self.codec = codec
        self.store = store
        self.budget = budget or CacheBudget()
        self.keys = KeyIndex(partition, store, retention or Retention())
        self._clean: OrderedDict[str, Aggregate] = OrderedDict()
        self._dirty: dict[str, tuple[int, Aggregate]] = {}
        self._unwritten: dict[str, Staged] = {}
        self._unwritten_offset: int | None = None
        self.broken: dict[str, Broken] = {}
        self._generation = 0
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one write at a time; close() waits for it
        self.closed = False
        self.position = None if store is None else store.position()
        self.snapshot_reads = 0  # cache misses that read the store (metrics, tests)
        self._repair: dict[str, Broken] = {}  # listed unreplayable: tried again by the replay
        self._repairing: set[str] = set()
        self.budget.join()

    # -- commands (on the event loop) ---------------------------------------------------------

    def get(self, aggregate_id: str) -> Aggregate | None:
        """The aggregate (None: it has no events yet); :class:`AggregateUnreplayable` if its
        state is unknown."""
        with self._lock:
            broken = self.broken.get(aggregate_id)
            if broken is not None:
                raise AggregateUnreplayable(aggregate_id, broken.reason)
            dirty = self._dirty.get(aggregate_id)
            if dirty is not None:
                return dirty[1]
            clean = self._clean.get(aggregate_id)
            if clean is not None:
                self._clean.move_to_end(aggregate_id)
                return clean
        return self._load(aggregate_id)

    def _load(self, aggregate_id: str) -> Aggregate | None:
        if self.store is None:
            return None
        self.snapshot_reads += 1
        (value,) = self.store.get_many([aggregate_id.encode()])
        if value is None:
            return None
        if is_marker(value):
            broken = decode_marker(value)
        else:
            try:
                aggregate = self.codec.decode(aggregate_id, value)
            except UndecodableSnapshot as exc:
                # Repaired, if ever, by replaying its events from the partition's start.
                broken = Broken(f"its snapshot cannot be decoded: {exc}", 0)
            else:
                with self._lock:
                    if aggregate_id not in self._dirty:  # a replay wrote it meanwhile: newer
                        self._clean[aggregate_id] = aggregate
                        self._evict()
                return aggregate
        with self._lock:
            self.broken.setdefault(aggregate_id, broken)
        raise AggregateUnreplayable(aggregate_id, broken.reason)

    def snapshot_of(self, aggregate: Aggregate) -> bytes | None:
        """The snapshot to write of ``aggregate`` (None without a store: nothing is written);
        :class:`~foldstream.domain.snapshots.UnstorableAggregate` if it has none, and
        :class:`RecordTooLarge` if it is larger than a changelog record may be."""
        if self.store is None:
            return None
        snapshot = self.codec.encode(aggregate)
        if len(snapshot) > MAX_SNAPSHOT_BYTES:
            raise RecordTooLarge(
                f"{aggregate.id!r} would take {len(snapshot)} bytes as a snapshot after this "
                f"command, more than a changelog record may ({MAX_SNAPSHOT_BYTES}). Nothing "
                "was appended"
            )
        return snapshot

    def stage(self, aggregate_id: str, aggregate: Aggregate) -> int:
        """Keep ``aggregate`` (a command's result, its transaction in flight) for the next
        commands; returns its generation, which :meth:`committed` hands back."""
        with self._lock:
            self._generation += 1
            self._dirty[aggregate_id] = (self._generation, aggregate)
            self._clean.pop(aggregate_id, None)
            return self._generation

    def committed(
        self,
        snapshots: Mapping[str, Staged],
        offset: int,
        keyed: Iterable[tuple[Stamp, int]] = (),
    ) -> None:
        """The transaction whose last event is at ``offset`` committed ``snapshots``
        (``{aggregate id: (generation, snapshot)}``) and the keyed commands ``keyed`` (each
        with the offset of its last event): they are written with the next
        :meth:`write_committed`."""
        with self._lock:
            self._unwritten.update(snapshots)
            self._unwritten_offset = offset
            self.keys.committed(keyed)
            if self.store is None:  # nothing to write: clean at once
                self._cleaned(self._unwritten)
                self._unwritten = {}
                self.keys.write_in_memory()

    def has_unwritten(self) -> bool:
        return (bool(self._unwritten) or self.keys.has_new()) and not self.closed

    def write_committed(self) -> int:
        """Write the committed snapshots not written yet (blocking: in a worker thread);
        returns how many. Raises what the store raises; they are written with the next call."""
        with self._writing:
            with self._lock:
                if self.closed or self.store is None or not self.has_unwritten():
                    return 0
                batch, self._unwritten = self._unwritten, {}
                offset = self._unwritten_offset
                keyed = self.keys.take()  # the keyed commands of the same transactions
            assert offset is not None
            changes: dict[bytes, bytes | None] = {i.encode(): v for i, (_, v) in batch.items()}
            try:
                self.keys.write(self.store, changes, offset, keyed)
            except BaseException:
                with self._lock:
                    self._unwritten = batch | self._unwritten  # newer ones win
                raise
            with self._lock:
                self.position = offset
                self._cleaned(batch)
            return len(batch)

    def _cleaned(self, written: Mapping[str, Staged]) -> None:
        """Aggregates whose snapshot of generation ``written[id]`` is written are clean,
        unless a later command changed them again."""
        for aggregate_id, (generation, _) in written.items():
            dirty = self._dirty.get(aggregate_id)
            if dirty is not None and dirty[0] == generation:
                del self._dirty[aggregate_id]
                self._clean[aggregate_id] = dirty[1]
        self._evict()

    def _evict(self) -> None:
        if self.store is None:
            return  # nothing to read them back from
        excess = len(self._clean) - self.budget.share()
        for _ in range(max(0, excess)):
            self._clean.popitem(last=False)

    def __len__(self) -> int:
        return len(self._clean) + len(self._dirty)

    def close(self, *, write: bool) -> None:
        """Stop writing: with ``write``, first write what is committed (blocking; a failure is
        only logged: the next owner replays those events); without, return at once (the next
        :meth:`wait_closed` waits for a write under way)."""
        if write:
            try:
                self.write_committed()
            except Exception:  # noqa: BLE001 - the events are on the topic: replayed later
                log.warning("partition %d: final snapshots not written", self.partition)
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._clean.clear()
            self._dirty.clear()
            self._unwritten.clear()
        self.keys.close()
        self.budget.leave()

    def wait_closed(self) -> None:
        """Return once no write of this (closed) partition's snapshots is under way."""
        with self._writing:
            pass

    # -- replay (in the thread taking the partition over) -------------------------------------

    def replay_start(self) -> int:
        """The first offset the replay reads: past the snapshots, or at the earliest event of an
        aggregate listed as unreplayable (tried again: see :mod:`.unreplayable`)."""
        start = 0 if self.position is None else self.position + 1
        if self.store is None:
            return start
        (index,) = self.store.get_many([INDEX_KEY])
        listed = decode_index(index)
        if listed:
            ids = list(listed)
            values = self.store.get_many([i.encode() for i in ids])
            for aggregate_id, value in zip(ids, values, strict=True):
                if value is not None and is_marker(value):
                    self._repair[aggregate_id] = decode_marker(value)
        if self._repair:
            start = min(start, *(b.at for b in self._repair.values()))
            log.info(
                "partition %d: replaying %d aggregates that could not be replayed before, from "
                "offset %d",
                self.partition,
                len(self._repair),
                start,
            )
        return start

    def replays(self, offset: int, aggregate_id: str | None) -> bool:
        """Whether the replay applies the record at ``offset`` of ``aggregate_id``: past the
        snapshots' position, or of an aggregate being repaired from its failed event on."""
        if aggregate_id is not None and aggregate_id in self.broken:
            return False  # its state is unknown since an earlier event
        if self.position is None or offset > self.position:
            return True
        repair = self._repair.get(aggregate_id or "")
        return repair is not None and offset >= repair.at

    def replayed_state(self, aggregate_id: str) -> Aggregate | None:
        """The state a replayed event applies to (its aggregate's repair starts from the
        snapshot kept before its failed event)."""
        repair = self._repair.get(aggregate_id)
        if repair is not None and aggregate_id not in self._repairing:
            self._repairing.add(aggregate_id)
            if repair.before is None:
                return None
            return self.codec.decode(aggregate_id, repair.before)
        with self._lock:
            dirty = self._dirty.get(aggregate_id)
        return dirty[1] if dirty is not None else self.get(aggregate_id)

    def replayed(self, aggregate_id: str, aggregate: Aggregate) -> None:
        self.stage(aggregate_id, aggregate)

    def broke(self, aggregate_id: str, reason: str, offset: int) -> None:
        """The event at ``offset`` of ``aggregate_id`` could not be applied: it takes no
        commands, and the store keeps why (with its last good snapshot, to repair it later)."""
        before: bytes | None = None
        with self._lock:
            dirty = self._dirty.pop(aggregate_id, None)
            clean = self._clean.pop(aggregate_id, None)
        current = dirty[1] if dirty is not None else clean
        repair = self._repair.get(aggregate_id)
        if current is not None:
            try:
                before = self.snapshot_of(current)
            except (UnstorableAggregate, RecordTooLarge):
                offset = 0  # no snapshot to start from: repaired from the partition's start
        elif repair is not None:  # failed again at its first event: keep what it kept
            before, offset = repair.before, min(offset, repair.at)
        elif self.store is not None:
            (value,) = self.store.get_many([aggregate_id.encode()])
            before = None if value is None or is_marker(value) else value
        self.broken[aggregate_id] = Broken(reason, offset, before)

    def checkpoint(self, offset: int) -> None:
        """After a poll batch read up to ``offset``: write what the replay rebuilt once enough
        waits (its snapshots reflect every event up to ``offset``). Not before the replay is
        past the snapshots' position: until then it rebuilds only aggregates being repaired,
        whose state must not be stored as reflecting the events it has not read yet."""
        if self.store is None:
            return  # every aggregate stays in memory: :meth:`finish` keeps them
        past = self.position is None or offset > self.position
        if past and len(self._dirty) >= min(REPLAY_FLUSH, max(1000, self.budget.share())):
            self._write_replayed(offset, final=False)

    def finish(self, offset: int | None) -> None:
        """Write every aggregate the replay rebuilt and the unreplayable ones, as the state after
        the record at ``offset`` (the last one read; None: nothing was read)."""
        if self.store is None:
            with self._lock:
                self._clean.update((i, a) for i, (_, a) in self._dirty.items())
                self._dirty.clear()
            self.keys.write_in_memory()
            return
        if offset is None or (self.position is not None and offset <= self.position):
            if not (self._dirty or self._repair or self.broken or self.keys.has_new()):
                return
            offset = max(offset or 0, self.position or 0)
        self._write_replayed(offset, final=True)

    def _write_replayed(self, offset: int, *, final: bool) -> None:
        assert self.store is not None
        with self._lock:
            dirty = dict(self._dirty)
        changes: dict[bytes, bytes | None] = {}
        for aggregate_id, (_, aggregate) in dirty.items():
            try:
                changes[aggregate_id.encode()] = self.snapshot_of(aggregate)
            except (UnstorableAggregate, RecordTooLarge) as exc:
                reason = f"its state cannot be kept as a snapshot: {exc}"
                self.broken[aggregate_id] = Broken(reason, 0)
        changes |= {i.encode(): b.encode() for i, b in self.broken.items()}
        # Listed: the broken ones, and those to repair that the replay has not reached yet.
        waiting = {i: b for i, b in self._repair.items() if i not in self._repairing}
        listed = {} if final else waiting
        listed |= self.broken
        if listed or self._repair:
            changes[INDEX_KEY] = encode_index(listed)
        self.keys.write(self.store, changes, offset, self.keys.take())
        with self._lock:
            self.position = offset
            self._cleaned({i: (g, b"") for i, (g, _) in dirty.items()})
        if final:
            self._repair = {}
