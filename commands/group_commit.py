"""Group commit: the commands of a partition that arrive while its transaction is in flight are
appended together, in the next transaction.

A partition has one writer and its transactions run one after another. Under load, each waits
for the previous one's round trips to the broker; committing every command that queued up
meanwhile in one transaction lets the throughput grow with the load instead of being capped at
one command per round trip, and costs an idle partition nothing (a lone command is committed at
once). Every command still gets the offset of its own last event, and a failed transaction fails
exactly the commands in it (and, since the writer is then closed, every later one).

Once a transaction committed, the snapshots of the aggregates its commands changed are written
to the aggregate store (:meth:`~.aggregates.PartitionAggregates.write_committed`), in a task of
the partition's own beside its next transactions: the snapshots of the transactions that
committed meanwhile are written together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from foldstream.backoff import Backoff
from foldstream.commands.aggregates import PartitionAggregates, Staged
from foldstream.commands.key_entries import Stamp
from foldstream.commands.writer import PartitionWriter
from foldstream.domain import EventRecord
from foldstream.errors import BrokerUnavailable, FoldstreamError, PartitionFenced, RecordTooLarge
from foldstream.http_input import MAX_EVENT_BYTES

log = logging.getLogger(__name__)

#: Records one transaction carries at most; more wait for the next one.
MAX_RECORDS_PER_TRANSACTION = 2_000
#: The largest record appended (key, value and headers): a larger one would fail its whole
#: transaction, and with it every command queued beside it.
MAX_RECORD_BYTES = MAX_EVENT_BYTES

FailureCallback = Callable[[PartitionWriter, FoldstreamError], None]


@dataclass
class _Batch:
    writer: PartitionWriter
    records: list[EventRecord] = field(default_factory=list)
    #: ``(index of a command's last record, the future its offset resolves)``
    waiters: list[tuple[int, asyncio.Future[int]]] = field(default_factory=list)
    #: ``{aggregate id: (generation, snapshot)}`` of the aggregates its commands changed
    snapshots: dict[str, Staged] = field(default_factory=dict)
    #: ``(index of a keyed command's last record, its stamp)``
    keyed: list[tuple[int, Stamp]] = field(default_factory=list)
    sealed: bool = False  # its transaction has started: nothing more joins it


class GroupCommitter:
    """Appends records through partition writers on ``executor``, one transaction at a time per
    partition. ``on_failed(writer, error)`` is called once per transaction that failed with
    :class:`PartitionFenced` or :class:`BrokerUnavailable` (the writer is closed by then).

    Use it from the event loop only.
    """

    def __init__(
        self,
        executor: Callable[[], Executor | None],
        on_failed: FailureCallback,
        *,
        max_records: int = MAX_RECORDS_PER_TRANSACTION,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        self._executor = executor
        self._on_failed = on_failed
        self._max_records = max_records
        self._max_record_bytes = max_record_bytes
        self._queues: dict[int, list[_Batch]] = {}
        self._flushing: set[int] = set()
        self._persisting: set[PartitionAggregates] = set()
        self.snapshots_written = 0  # (metrics, tests, benchmarks)
        self.transactions = 0  # committed (metrics, tests, benchmarks)
        self.commands = 0  # whose transaction committed

    def check(self, records: Sequence[EventRecord]) -> None:
        """Raise :class:`RecordTooLarge` if a record is larger than ``max_record_bytes``: the
        producer would fail the whole transaction on it."""
        for record in records:
            size = record_size(record)
            if size > self._max_record_bytes:
                raise RecordTooLarge(
                    f"an event of this command would be a {size}-byte Kafka record; at most "
                    f"{self._max_record_bytes}. Nothing was appended"
                )

    def append(
        self,
        writer: PartitionWriter,
        records: Sequence[EventRecord],
        snapshot: tuple[str, Staged] | None = None,
        keyed: Stamp | None = None,
    ) -> asyncio.Future[int]:
        """Queue ``records`` (one command's) for ``writer``'s partition; the future resolves to
        the offset of the last of them once their transaction committed, or raises its error.
        ``snapshot``: ``(aggregate id, (generation, snapshot))`` of the aggregate the command
        changed, written to the aggregate store once the transaction committed; ``keyed``: the
        stamp of a command sent with an ``Idempotency-Key``, indexed once it committed (even
        if its client went away meanwhile).

        Raises :class:`RecordTooLarge`, queueing nothing, if a record is larger than
        ``max_record_bytes`` (:meth:`check`)."""
        self.check(records)
        loop = asyncio.get_running_loop()
        queue = self._queues.setdefault(writer.partition, [])
        batch = queue[-1] if queue else None
        if (
            batch is None
            or batch.sealed
            or batch.writer is not writer
            or len(batch.records) + len(records) > self._max_records
        ):
            batch = _Batch(writer)
            queue.append(batch)
        batch.records.extend(records)
        if snapshot is not None:
            batch.snapshots[snapshot[0]] = snapshot[1]
        done: asyncio.Future[int] = loop.create_future()
        batch.waiters.append((len(batch.records) - 1, done))
        if keyed is not None:
            batch.keyed.append((len(batch.records) - 1, keyed))
        if writer.partition not in self._flushing:
            self._flushing.add(writer.partition)
            loop.create_task(self._flush(writer.partition))
        return done

    async def _flush(self, partition: int) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queues[partition]
        try:
            while queue:
                batch = queue[0]
                batch.sealed = True
                try:
                    offsets = await loop.run_in_executor(
                        self._executor(), batch.writer.append, batch.records
                    )
                except Exception as exc:  # noqa: BLE001 - handed to every command of the batch
                    batch.writer.aggregates.keys.failed(stamp for _, stamp in batch.keyed)
                    if isinstance(exc, PartitionFenced | BrokerUnavailable):
                        self._on_failed(batch.writer, exc)
                    for _, waiter in batch.waiters:
                        if not waiter.done():
                            waiter.set_exception(exc)
                else:
                    self.transactions += 1
                    self.commands += len(batch.waiters)
                    for index, waiter in batch.waiters:
                        if not waiter.done():  # the client may have gone away meanwhile
                            waiter.set_result(offsets[index])
                    keyed = [(stamp, offsets[index]) for index, stamp in batch.keyed]
                    self._committed(batch, offsets[-1], keyed)
                finally:
                    queue.pop(0)
        finally:
            self._flushing.discard(partition)

    def _committed(self, batch: _Batch, offset: int, keyed: list[tuple[Stamp, int]]) -> None:
        """Hand the committed batch's snapshots and keyed commands over to be written (see the
        module)."""
        aggregates = batch.writer.aggregates
        aggregates.committed(batch.snapshots, offset, keyed)
        if aggregates.has_unwritten() and aggregates not in self._persisting:
            self._persisting.add(aggregates)
            asyncio.get_running_loop().create_task(self._persist(aggregates))

    async def _persist(self, aggregates: PartitionAggregates) -> None:
        """Write ``aggregates``' committed snapshots until none are left (or it is closed); a
        failure is tried again after a backoff (its aggregates stay in memory meanwhile)."""
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        try:
            while aggregates.has_unwritten():
                try:
                    self.snapshots_written += await loop.run_in_executor(
                        self._executor(), aggregates.write_committed
                    )
                except Exception as exc:  # noqa: BLE001 - the events are committed: retried
                    delay = backoff.failed(loop.time())
                    log.warning(
                        "writing the snapshots of partition %d failed (%s); again in %.1fs",
                        aggregates.partition,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                else:
                    backoff.reset()
        finally:
            self._persisting.discard(aggregates)


def record_size(record: EventRecord) -> int:
    """The bytes of ``record``'s key, value and headers."""
    headers = sum(len(name) + len(value) for name, value in record.headers)
    return len(record.key) + len(record.value or b"") + headers
