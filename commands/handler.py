"""Runs commands against aggregates and appends the resulting events to the events topic.

The handler accepts commands only for the partitions it owns (:meth:`CommandHandler.assign`).
For each it is the single writer: a transactional producer per partition fences any previous
writer, then the partition is replayed to its end to rebuild its aggregates. With an aggregate
store (``snapshots``: :mod:`.snapshot_store`), the replay starts past the snapshots the store
holds, every committed transaction's aggregates are written to it, and memory holds a bounded
cache of them (``cache_size`` aggregates per instance: :mod:`.aggregates`); without one, every
aggregate stays in memory and the replay starts at offset 0. Commands of one partition run one
at a time on the event loop, each against the state the previous ones left (including commands
whose transaction is still in flight), so an expected version is checked against the
partition's latest state. Their events are appended by group commit (:mod:`.group_commit`); a
failed transaction closes the writer, which fails every later command too, and the partition's
aggregates are rebuilt by a replay when it is taken again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from foldstream.commands.aggregates import DEFAULT_CACHE_SIZE, CacheBudget, PartitionAggregates
from foldstream.commands.arguments import CommandArguments, command_arguments
from foldstream.commands.group_commit import MAX_RECORD_BYTES, GroupCommitter
from foldstream.commands.idempotency import KeyedRequest, with_key
from foldstream.commands.key_entries import Retention
from foldstream.commands.outcomes import CommandResult, UnknownCommand, describe
from foldstream.commands.replay import replay
from foldstream.commands.snapshot_store import SnapshotStore
from foldstream.commands.working_copy import run_on_copy, version_of
from foldstream.commands.writer import PartitionWriter
from foldstream.domain import Aggregate, EventCodec
from foldstream.domain.snapshots import SnapshotCodec
from foldstream.errors import (
    ConfigurationError,
    FoldstreamError,
    NotOwner,
)
from foldstream.kafka import partition_for

log = logging.getLogger(__name__)


class ReplayCancelled(FoldstreamError):
    """A partition was given up while it was being replayed; nothing was taken over.

    Remedy: none, the partition moved on.
    """


def _check_wanted(partitions: Iterable[int], still_wanted: Callable[[int], bool] | None) -> None:
    dropped = [p for p in partitions if still_wanted is not None and not still_wanted(p)]
    if dropped:
        raise ReplayCancelled(f"partitions {dropped} were given up before their replay ended")


ReleaseCallback = Callable[[int, FoldstreamError], None]


class CommandHandler:
    """Handles commands for ``aggregates`` (``{"product": Product}``) on ``topic``.

    Lifecycle: :meth:`start`, then :meth:`assign` / :meth:`revoke` as partitions come and go
    (from worker threads: they block), :meth:`handle` on the event loop, :meth:`close`.

    ``transactional_id_prefix`` (default: ``topic``) names each partition's producer
    ``<prefix>.<partition>``; every instance of a service must use the same prefix, which is
    what makes a new owner fence the old one. ``on_released(partition, error)`` is called on the
    event loop when the handler gives a partition up by itself: fenced by another writer
    (:class:`PartitionFenced`) or after a transaction whose outcome is unknown
    (:class:`BrokerUnavailable`). It must not block. ``snapshots``: the aggregate store
    (None: every aggregate in memory, replayed from offset 0 at every takeover);
    ``cache_size``: the aggregates kept in memory with a store, shared by the partitions;
    ``retention``: how long and how many keyed commands each partition remembers
    (:mod:`.key_index`).
    """

    def __init__(
        self,
        *,
        aggregates: Mapping[str, type[Aggregate]],
        bootstrap: str,
        topic: str,
        partitions: int,
        transactional_id_prefix: str | None = None,
        linger_ms: int = 5,
        fetch_wait_max_ms: int = 10,
        transaction_timeout: float = 10.0,
        on_released: ReleaseCallback | None = None,
        max_record_bytes: int = MAX_RECORD_BYTES,
        snapshots: SnapshotStore | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        retention: Retention | None = None,
    ) -> None:
        self.aggregates = dict(aggregates)
        self.retention = retention or Retention()
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.transactional_id_prefix = transactional_id_prefix or topic
        self.linger_ms = linger_ms
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.transaction_timeout = transaction_timeout
        self.on_released = on_released
        self._codec = EventCodec(self.aggregates.values())
        self._snapshot_codec = SnapshotCodec(self.aggregates)
        self._commands = command_arguments(self.aggregates)
        self.snapshots = snapshots
        self.cache = CacheBudget(cache_size)
        #: Each partition's aggregates given up last: a new takeover waits for their last write.
        self._retired: dict[int, PartitionAggregates] = {}
        # Lock order: _membership, then _guard (held briefly, never around a blocking call),
        # then a writer's own lock (held for one transaction). The event loop takes only _guard.
        self._membership = threading.Lock()  # one assign/revoke/close at a time
        self._guard = threading.Lock()  # _writers and _replaying
        self._writers: dict[int, PartitionWriter] = {}
        self._replaying: set[int] = set()
        self._replay_skipped = 0  # records replays skipped, for the metrics
        self._replayed_events = 0  # events replays applied, for the metrics
        self._replay_started: dict[int, int] = {}  # partition -> offset its last replay read from
        self._executor: ThreadPoolExecutor | None = None
        # Refuses a command whose event the producer would refuse (:class:`RecordTooLarge`).
        self._committer = GroupCommitter(
            lambda: self._executor, self._release, max_record_bytes=max_record_bytes
        )

    def start(self) -> None:
        """Start the threads that run transactions; the handler owns no partition yet."""
        if self._executor is None:
            # A transaction and a write of snapshots at once per partition.
            self._executor = ThreadPoolExecutor(
                max_workers=min(64, 2 * self.partitions), thread_name_prefix="foldstream-commit"
            )

    def partition_of(self, aggregate_id: str) -> int:
        """The partition of the events topic that holds ``aggregate_id``'s events."""
        return partition_for(aggregate_id.encode(), self.partitions)

    def counts(self) -> dict[str, int]:
        """``{"transactions": n, "commands": n}`` committed since the start (group commit puts
        several commands in one transaction under load), and ``replay_skipped``: records
        replays skipped (:mod:`.replay`)."""
        committed = self._committer
        return {"transactions": committed.transactions, "commands": committed.commands} | {
            "replay_skipped": self._replay_skipped,
            "replayed_events": self._replayed_events,
            "snapshots_written": committed.snapshots_written,
        }

    def owned(self) -> frozenset[int]:
        """The partitions accepting commands (assigned and replayed)."""
        with self._guard:
            return frozenset(self._writers)

    def version(self, aggregate_id: str) -> int:
        """The current version of ``aggregate_id`` (0 without events); NotOwner if not owned."""
        return version_of(
            self._writer(self.partition_of(aggregate_id)).aggregates.get(aggregate_id)
        )

    def replayed_from(self, partition: int) -> int | None:
        """The offset the last takeover of ``partition`` replayed it from (None: not taken)."""
        return self._replay_started.get(partition)

    def assign(
        self, partitions: Iterable[int], *, still_wanted: Callable[[int], bool] | None = None
    ) -> int:
        """Become the writer of ``partitions``; return the number of events replayed.

        Blocking: call it from a worker thread. For each partition not owned yet, a transactional
        producer with id ``<prefix>.<partition>`` fences every previous writer, then the
        partition is replayed to its end (past the snapshots of the aggregate store, from offset
        0 without one) and starts accepting commands. Nothing is
        taken over when any step fails (the error is raised), or when ``still_wanted`` says a
        partition is no longer wanted (checked before opening its writer, during the replay and
        before taking it: :class:`ReplayCancelled`).
        """
        wanted = sorted(set(partitions))
        outside = [p for p in wanted if not 0 <= p < self.partitions]
        if outside:
            raise ConfigurationError(
                f"partitions {outside} do not exist: {self.topic} has {self.partitions}"
            )
        with self._membership:
            with self._guard:
                new = [p for p in wanted if p not in self._writers]
                self._replaying.update(new)
            writers: dict[int, PartitionWriter] = {}
            try:
                writers.update((p, self._new_writer(p)) for p in new)
                # Opening a writer fences the partition's previous one: not for a partition the
                # cluster took back while this call waited.
                _check_wanted(new, still_wanted)
                if writers:
                    with ThreadPoolExecutor(max_workers=min(8, len(writers))) as pool:
                        list(pool.map(PartitionWriter.open, writers.values()))
                replayed = self._replay(writers, still_wanted)
                _check_wanted(writers, still_wanted)
            except BaseException:
                for writer in writers.values():
                    writer.close()
                with self._guard:
                    self._replaying.difference_update(new)
                raise
            with self._guard:
                self._writers.update(writers)
                self._replaying.difference_update(new)
        starts = {p: self._replay_started.get(p) for p in new}
        log.info(
            "took partitions %s of %s over: %d events replayed (read from offsets %s)",
            new,
            self.topic,
            replayed,
            starts,
        )
        return replayed

    def revoke(self, partitions: Iterable[int]) -> None:
        """Stop accepting commands for ``partitions`` and drop their aggregates.

        Blocking: call it from a worker thread. Waits for a transaction in flight on those
        partitions to finish; once it returns, this handler appends nothing more to them.
        """
        with self._membership:
            with self._guard:
                writers = [self._writers.pop(p) for p in set(partitions) if p in self._writers]
            for writer in writers:
                writer.close()

    def close(self) -> None:
        """Give every partition up and stop the transaction threads."""
        self.revoke(range(self.partitions))
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _new_writer(self, partition: int) -> PartitionWriter:
        retired = self._retired.pop(partition, None)
        if retired is not None:
            retired.wait_closed()  # its last snapshots are written before the replay reads
        store = None if self.snapshots is None else self.snapshots.partition(partition)
        aggregates = PartitionAggregates(
            partition, self._snapshot_codec, store, self.cache, self.retention
        )
        return PartitionWriter(
            bootstrap=self.bootstrap,
            topic=self.topic,
            partition=partition,
            transactional_id=f"{self.transactional_id_prefix}.{partition}",
            linger_ms=self.linger_ms,
            timeout=self.transaction_timeout,
            aggregates=aggregates,
        )

    def _replay(
        self,
        writers: Mapping[int, PartitionWriter],
        still_wanted: Callable[[int], bool] | None = None,
    ) -> int:
        if not writers:
            return 0
        held = {p: w.aggregates for p, w in writers.items()}
        check = functools.partial(_check_wanted, writers, still_wanted)
        replayed = replay(
            self._codec, self.bootstrap, self.topic, held, self.fetch_wait_max_ms, check
        )
        self._replay_skipped += replayed.skipped
        self._replayed_events += replayed.events
        self._replay_started.update(replayed.starts)
        return replayed.events

    def _writer(self, partition: int) -> PartitionWriter:
        with self._guard:
            writer = self._writers.get(partition)
            if writer is None:
                if partition in self._replaying:
                    raise NotOwner(partition, "is being replayed by this instance")
                raise NotOwner(partition)
        return writer

    def _release(self, writer: PartitionWriter, error: FoldstreamError) -> None:
        # Its aggregates may hold effects of commands whose transaction failed: drop them all
        # (taking the partition again replays it, once a write of snapshots under way ended).
        writer.aggregates.close(write=False)
        self._retired[writer.partition] = writer.aggregates
        with self._guard:
            mine = self._writers.get(writer.partition) is writer
            if mine:
                del self._writers[writer.partition]
        if mine:
            log.warning("gave partition %d up: %s", writer.partition, error)
            if self.on_released is not None:
                self.on_released(writer.partition, error)

    def arguments(self, aggregate: str, command: str) -> CommandArguments:
        """How ``command`` of ``aggregate`` takes its arguments; :class:`UnknownCommand` if
        there is no such command."""
        try:
            return self._commands[aggregate][command]
        except KeyError:
            raise UnknownCommand(
                f"no command {command!r} on aggregate {aggregate!r}"
                if aggregate in self._commands
                else f"no aggregate {aggregate!r}; aggregates: {sorted(self._commands)}"
            ) from None

    async def handle(
        self,
        aggregate: str,
        aggregate_id: str,
        command: str,
        arguments: Any,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> CommandResult:
        """Run ``command`` on the aggregate and append its events; raises on any rejection.

        When ``expected_version`` is given, the command runs only if the aggregate is at that
        version (0: it has no events yet), else :class:`VersionConflict`; the version counts
        commands whose transaction is still in flight. The events are appended by the
        partition's writer, in one transaction with those of the commands queued beside them.
        Nothing is appended and nothing changes in memory when the command is rejected
        (:class:`NotOwner`, :class:`VersionConflict`, :class:`DomainRuleViolation`,
        :class:`InvalidArguments`, :class:`UnknownCommand`, :class:`RecordTooLarge` (an event,
        or the aggregate's snapshot after it, too large), :class:`AggregateUnreplayable`,
        :class:`~foldstream.domain.snapshots.UnstorableAggregate`). When its transaction fails
        (:class:`PartitionFenced`, :class:`BrokerUnavailable`) the handler gives the partition
        up with its aggregates, and every command queued after it fails too.

        With ``idempotency_key``, a command the key named before and the partition still
        remembers is not run again: its first outcome is answered (``remembered``), or
        :class:`~.idempotency.IdempotencyKeyReused` if the key came with another request; one
        still in flight is waited for first (:mod:`.key_index`).
        """
        kwargs = self.arguments(aggregate, command).bind(arguments)
        if self._executor is None:
            raise RuntimeError("the command handler is not started")
        cls = self.aggregates[aggregate]
        partition = self.partition_of(aggregate_id)
        keyed = None
        if idempotency_key is not None:
            keyed = KeyedRequest.of(
                idempotency_key, aggregate, aggregate_id, command, arguments, expected_version
            )
        writer, remembered = await self._writer_and_outcome(partition, keyed)
        if remembered is not None:
            return remembered
        # No await until the events are queued: commands of a partition run one at a time.
        aggregates = writer.aggregates
        current = aggregates.get(aggregate_id)  # a snapshot read on a cache miss
        working, events = run_on_copy(cls, aggregate_id, current, expected_version, command, kwargs)
        described = describe(events)
        records = [self._codec.encode(e) for e in events]
        stamp = None if keyed is None else aggregates.keys.stamp(keyed, described)
        if stamp is not None:
            records = [with_key(record, stamp.header) for record in records]
        self._committer.check(records)
        snapshot = aggregates.snapshot_of(working)  # refused here if it cannot be stored
        # The next command sees this one's effects; if its transaction fails, the writer is
        # closed and these aggregates are dropped with it.
        generation = aggregates.stage(aggregate_id, working)
        staged = None if snapshot is None else (aggregate_id, (generation, snapshot))
        if stamp is not None:
            aggregates.keys.begin(stamp)  # a retry meanwhile waits for this attempt
        offset = await self._committer.append(writer, records, staged, stamp)
        return CommandResult(described, partition, offset)

    async def _writer_and_outcome(
        self, partition: int, keyed: KeyedRequest | None
    ) -> tuple[PartitionWriter, CommandResult | None]:
        """The partition's writer, and the outcome of the command ``keyed`` names if the
        partition remembers it (None: run it). An attempt of it still in flight is waited for
        (it always ends: its transaction has a timeout), then the partition asked again."""
        while True:
            writer = self._writer(partition)
            found = None if keyed is None else writer.aggregates.keys.find(keyed)
            if not isinstance(found, asyncio.Future):
                return writer, found
            await asyncio.shield(found)
