"""A Spark task's fold: the records of its Kafka partitions, read once, folded into each store
of its query (:mod:`~foldstream.projections.query_groups`) by
:func:`~foldstream.projections.fold.fold_and_send`, each store's changelog and dead-letter
records acknowledged in one wait, then each store's chunk committed with its source offset
(module docstring of :mod:`~foldstream.projections.fold`)."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from foldstream.projections.chunks import FOLD_CHUNK_RECORDS, Records, partition_chunks
from foldstream.projections.fold import commit_folded, fold_and_send
from foldstream.projections.poison import PoisonPolicy
from foldstream.projections.projection import Projection
from foldstream.projections.query_groups import store_entries
from foldstream.projections.staged import Staging
from foldstream.projections.task_output import (
    ChangelogTarget,
    Folded,
    await_changelog,
    task_producer,
)
from foldstream.projections.task_steps import TaskSteps
from foldstream.projections.worker import after_task, gc_paused
from foldstream.state.host import PartitionClosed
from foldstream.state.host_client import RemotePartition, call_host

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
    and one wait for the changelog's acknowledgements."""

    def __init__(self, options: Mapping[str, str]) -> None:
        from foldstream.service import load_service

        service = load_service(options["service"])
        host = options["store_host"], bytes.fromhex(options["store_token"])
        entries = store_entries(options)
        self.producer = (
            task_producer(options["bootstrap"])
            if any(e.get("changelog_topic") or e.get("dead_letter_topic") for e in entries)
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
        """Wait for the pending partitions' changelog and dead-letter records of every store,
        then commit each."""
        with self.steps.step("changelog"):
            await_changelog([f for store in self.stores for f in store.pending.values()])
        for store in self.stores:
            store.commit()

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
        self.changelog_topic = options.get("changelog_topic")
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
        # Partitions folded, whose changelog records are on their way: one wait for all of
        # their acknowledgements instead of a round trip per partition (a micro-batch's
        # latency).
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
            changelog = None
            if self.producer is not None and self.changelog_topic:
                changelog = ChangelogTarget(
                    self.producer,
                    self.changelog_topic,
                    partition,
                    writer.epoch,
                    writer.source_id,
                )
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
                    folded = fold_and_send(self.projection, writer, records, changelog, poison)
                else:
                    folded = stage.fold(writer, records, changelog, poison)
        except PartitionClosed:
            self.moved.add(partition)
            return
        if folded is not None:
            self.pending[partition] = folded
            if folded.stop is not None:
                self.moved.add(partition)  # its later chunks stay unfolded

    def commit(self) -> None:
        """Commit each pending partition (its changelog and dead-letter records acknowledged);
        report where a partition stopped once what came before it is committed."""
        for partition, folded in self.pending.items():
            try:
                with self.steps.step("commit"):
                    done = commit_folded(folded)
            except PartitionClosed:
                self.moved.add(partition)
                continue
            self.outcomes.update(folded.outcomes)
            self.late += folded.late
            if done is not None:
                count, offset = done
                before = self.applied.get(partition, (0, offset))[0]
                self.applied[partition] = (before + count, offset)
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
