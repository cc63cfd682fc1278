"""A Spark task's fold: the records of its Kafka partitions, read once, folded into each store
of its query (:mod:`~foldstream.projections.query_groups`) by
:func:`~foldstream.projections.fold.fold_and_send`, each store's dead-letter and forwarded
records acknowledged in one wait, then each store's chunk committed (to its changelog, then
with its source offset: module docstring of :mod:`~foldstream.projections.fold`)."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from foldstream.projections.chunks import FOLD_CHUNK_RECORDS, Records, partition_chunks
from foldstream.projections.fold import fold_and_send
from foldstream.projections.poison import PoisonPolicy
from foldstream.projections.projection import Projection
from foldstream.projections.query_groups import store_entries
from foldstream.projections.staged import Staging
from foldstream.projections.task_output import Folded, await_acknowledgements, task_producer
from foldstream.projections.task_steps import TaskSteps
from foldstream.projections.worker import after_task, gc_paused
from foldstream.state.host import PartitionClosed
from foldstream.state.host_client import RemotePartition, call_host, commit_all

log = logging.getLogger(__name__)

Fetched = TypeVar("Fetched")


def fold_task(
    options: Mapping[str, str],
    fetches: Iterable[Fetched],
    decode: Callable[[Fetched], Mapping[int, Records]],
) -> dict[int, tuple[int, int]]:
    """Fold one Spark task's records (see the module docstring), which arrive as ``fetches``
    that ``decode`` turns into ``{partition: records}``, into each store of the options of
    :class:`~foldstream.projections.datasources.FoldSource` (several stores of one topic share
    a query: :mod:`~foldstream.projections.query_groups`); returns ``{partition: (records
    applied, last offset)}`` of the store that got furthest (of those, the one that applied
    most). The time of each step, the records handled and the poison records go to the store
    host (:mod:`~foldstream.projections.task_steps`)."""
    task = _FoldTask(options)
    with gc_paused():
        groups = map(decode, task.steps.waited(fetches, "input"))
        chunks = partition_chunks(groups, FOLD_CHUNK_RECORDS)
        for partition, records in task.steps.waited(chunks, "decode"):
            task.fold(partition, records)
        task.settle()
    task.report()
    after_task(task.handled)
    return task.applied()


class _FoldTask:
    """The state of one :func:`fold_task`: its stores' folds, sharing the records, the producer
    and one wait for the dead-letter and forwarded records' acknowledgements."""

    def __init__(self, options: Mapping[str, str]) -> None:
        from foldstream.service import load_service

        service = load_service(options["service"])
        host = options["store_host"], bytes.fromhex(options["store_token"])
        entries = store_entries(options)
        # The dead letters' and forwarded records' (the changelog's writer is the store host's).
        self.producer = (
            task_producer(options["bootstrap"])
            if any(e.get("dead_letter_topic") or e.get("forwards") for e in entries)
            else None
        )
        self.steps = TaskSteps()
        self.handled = 0
        self.stores = [
            _StoreFold(
                service.projection(entry["store"]),
                {**options, **entry},
                service.projections,
                host,
                self.producer,
                self.steps,
            )
            for entry in entries
        ]

    def fold(self, partition: int, records: Records) -> None:
        """Fold one chunk of ``partition``'s records into each store (committed by a later
        :meth:`settle`)."""
        self.handled += len(records)
        # A partition's next chunk reads what its previous one wrote: commit that first.
        # Pending chunks are also bounded in records, as chunks are (memory).
        pending = sum(f.applied for store in self.stores for f in store.pending.values())
        if (
            any(partition in store.pending for store in self.stores)
            or pending + len(records) > FOLD_CHUNK_RECORDS
        ):
            self.settle()
        for store in self.stores:
            store.fold(partition, records)

    def settle(self) -> None:
        """Wait for the pending partitions' dead-letter and forwarded records of every store,
        then commit them all in one request: the store host writes them side by side, each
        partition's changes to its changelog, then to its state."""
        pending = [(s, p, f) for s in self.stores for p, f in s.pending.items()]
        with self.steps.step("acks"):
            await_acknowledgements([folded for _, _, folded in pending])
        writes = [(s, p, f) for s, p, f in pending if f.last_offset is not None]
        with self.steps.step("commit"):
            closed = commit_all([(_remote(f), f.last_offset or 0) for _, _, f in writes])
        outcome = {(id(s), p): c for (s, p, _), c in zip(writes, closed, strict=True)}
        for store in self.stores:
            store.committed({p: outcome.get((id(store), p)) for p in store.pending})

    def applied(self) -> dict[int, tuple[int, int]]:
        applied: dict[int, tuple[int, int]] = {}
        for store in self.stores:
            for partition, (count, offset) in store.applied.items():
                seen_count, seen_offset = applied.get(partition, (-1, -1))
                if (offset, count) > (seen_offset, seen_count):
                    applied[partition] = (count, offset)
        return applied

    def report(self) -> None:
        """Tell the store host, for each store, where the task's time went (the steps are
        shared by the stores of a query), the records it handled and what became of its poison
        records (the metrics)."""
        for store in self.stores:
            store.report(self.handled)


def _remote(folded: Folded) -> RemotePartition:
    """The store host's partition ``folded`` was folded into (a task folds into no other)."""
    assert isinstance(folded.writer, RemotePartition), folded.writer
    return folded.writer


class _StoreFold:
    """One store's part of a :class:`_FoldTask`."""

    def __init__(
        self,
        projection: Projection,
        options: Mapping[str, str],
        projections: Sequence[Projection],
        host: tuple[str, bytes],
        producer: Any,
        steps: TaskSteps,
    ) -> None:
        self.projection = projection
        self.store = projection.store
        self.host, self.authkey = host
        self.source_topic = options.get("topic", "")
        self.dead_letter_topic = options.get("dead_letter_topic")
        self.producer = producer
        self.staging = Staging.of(options, projection, projections, producer)
        self.steps = steps
        self.applied: dict[int, tuple[int, int]] = {}
        self.outcomes: Counter[str] = Counter()
        self.late = 0  # records a windowed store dropped as late
        # Partitions moved to another instance, or stopped (policy ``stop``), since the batch
        # was planned: left to their new owner, which resumes from the offset stored with the
        # state (or to a restart of this instance).
        self.moved: set[int] = set()
        # Partitions folded, whose dead-letter and forwarded records are on their way: one
        # wait for all of their acknowledgements instead of a round trip per partition (a
        # micro-batch's latency).
        self.pending: dict[int, Folded] = {}

    def fold(self, partition: int, records: Records) -> None:
        """Fold one chunk of ``partition``'s records (committed by a later :meth:`commit`)."""
        if partition in self.moved:
            return
        try:
            with self.steps.step("read"):
                stage = None if self.staging is None else self.staging.stage(partition)
                read_keys = self.projection.read_keys if stage is None else stage.keys
                keys = read_keys(records)
                writer = RemotePartition(self.host, self.authkey, self.store, partition, keys)
            poison = PoisonPolicy(
                self.store,
                self.projection.on_error,
                self.source_topic,
                partition,
                self.producer,
                self.dead_letter_topic,
            )
            with self.steps.step("fold"):
                if stage is None:
                    folded = fold_and_send(self.projection, writer, records, poison)
                else:
                    folded = stage.fold(writer, records, poison)
        except PartitionClosed:
            self.moved.add(partition)
            return
        if folded is not None:
            self.pending[partition] = folded
            if folded.stop is not None:
                self.moved.add(partition)  # its later chunks stay unfolded

    def committed(self, closed: Mapping[int, PartitionClosed | None]) -> None:
        """Count what the pending partitions committed (``closed``: the partitions the host
        refused, moved away meanwhile); report where a partition stopped once what came before
        it is committed."""
        for partition, folded in self.pending.items():
            if closed[partition] is not None:
                self.moved.add(partition)
                continue
            self.outcomes.update(folded.outcomes)
            self.late += folded.late
            if folded.last_offset is not None:
                offset = folded.last_offset
                before = self.applied.get(partition, (0, offset))[0]
                self.applied[partition] = (before + folded.applied, offset)
            if folded.stop is not None:
                with contextlib.suppress(PartitionClosed):  # moved meanwhile: nothing to stop
                    stop = ("stop", self.store, partition, *folded.stop)
                    call_host(self.host, self.authkey, stop)
        self.pending.clear()

    def report(self, handled: int) -> None:
        report = ("task", self.store, None, self.steps.seconds, handled, dict(self.outcomes))
        try:
            call_host(self.host, self.authkey, report)
            if self.late:
                call_host(self.host, self.authkey, ("late", self.store, None, self.late))
        except Exception:  # noqa: BLE001 - the batch is committed: only a metric is lost
            log.warning("could not report the task's steps to the store host", exc_info=True)
