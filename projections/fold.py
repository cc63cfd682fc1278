"""A projection's fold, run inside the Spark task that reads the records.

The stream reader of :class:`~foldstream.projections.datasources.FoldSource`
(:class:`~foldstream.projections.source.FoldStreamReader`) plans micro-batches like any Kafka
source, and each task folds the records of its Kafka partitions where it reads them
(:func:`fold_task`), then hands Spark one row per partition (records applied, last offset) for
the JVM's ``noop`` sink. Folding in a separate Python sink would cost every task a second
Python worker, and every record a trip through the JVM and two Arrow conversions: ``make
bench`` measures both do-nothing queries, a Python reader into a Python writer and into
``noop``.

For each Kafka partition in a task, in offset order and in chunks of up to
:data:`FOLD_CHUNK_RECORDS` records as they arrive (so a rebuild's large micro-batches need no
more memory than small ones): skip records at or below the offset stored
with the state (a replayed micro-batch applies nothing twice), fold the rest, send every changed
key's new value to the store's compacted changelog (a tombstone for a delete) and wait for the
acks, then commit values and the source offset in one RocksDB write batch. A crash between the
two steps only re-sends identical changelog values on replay. The partitions are held open by
the instance's :class:`~foldstream.state.host.StoreHost`, which the task reads and writes over a
local connection.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import Producer

from foldstream.changelog import (
    BATCH_END_HEADER,
    BATCH_START_HEADER,
    EPOCH_HEADER,
    FOLDED_FROM_HEADER,
    SOURCE_ID_HEADER,
    SOURCE_OFFSET_HEADER,
)
from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import produce_when_room, producer_config
from foldstream.projections.ordered import OrderedStore
from foldstream.projections.projection import Projection
from foldstream.projections.source import Planned
from foldstream.projections.task_steps import TaskSteps
from foldstream.projections.worker import after_task, gc_paused
from foldstream.state import PartitionWriter
from foldstream.state.host import PartitionClosed, RemotePartition, call_host

log = logging.getLogger(__name__)

_producers: dict[str, Producer] = {}
#: How long a task waits for its changelog records' acknowledgements before it fails.
CHANGELOG_ACK_TIMEOUT_S = 30


def _producer(bootstrap: str) -> Producer:
    # One idempotent producer per reused Python worker.
    producer = _producers.get(bootstrap)
    if producer is None:
        producer = Producer(
            producer_config(
                bootstrap,
                linger_ms=2,
                # A rebuild sends up to a key per record: room for whole micro-batches.
                # Records still queued when their task gives up must never land later, after
                # the retry's: they expire first (librdkafka then drops them for good).
                **{
                    "queue.buffering.max.messages": 1_000_000,
                    "batch.num.messages": 10_000,
                    "message.timeout.ms": CHANGELOG_ACK_TIMEOUT_S * 1000 * 2 // 3,
                },
            )
        )
        _producers[bootstrap] = producer
    return producer


class ChangelogTarget(NamedTuple):
    """Where a partition's changed values go: its changelog ``partition`` of ``topic``, each
    record stamped with ``epoch``, the epoch of the instance's hold of the partition, and with
    ``source_id``, the id of the source topic folded (None: the broker has no topic ids)."""

    producer: Producer
    topic: str
    partition: int
    epoch: int
    source_id: str | None = None


Records = list[tuple[int, EventRecord]]
"""``(offset, record)`` pairs of one Kafka partition."""


def records_of_messages(messages: Sequence[Any]) -> dict[int, Records]:
    """confluent-kafka messages as ``{partition: records}``, each partition's in the order
    read."""
    found: dict[int, Records] = {}
    for message in messages:
        found.setdefault(message.partition(), []).append(
            (message.offset(), EventRecord.from_message(message))
        )
    return found


def records_of_planned(planned: Planned) -> dict[int, Records]:
    """The records a micro-batch was planned with (:attr:`KafkaRanges.planned`) as
    ``{partition: records}``."""
    return {
        partition: [
            (
                r.offset,
                EventRecord(r.key, r.value, tuple(r.headers) if r.headers else (), r.timestamp),
            )
            for r in kept
        ]
        for partition, kept in planned
    }


#: Records of one partition that a task folds and commits together. A micro-batch is folded in
#: such chunks as its fetches arrive, so a task's memory (records, changed values, queued
#: changelog records) stays bounded however large the micro-batch, e.g. a rebuild's: by this many
#: records per partition the task reads (a partition's records wait until they fill a chunk or
#: the task's input ends). Each chunk sends one changelog record per key it changed: larger
#: chunks send fewer (a 2M-event rebuild over 100k keys, `make bench`, measured when a Python
#: sink still folded what the reader yielded: 41.1k and 41.6k events per CPU-second at 50k,
#: 37.7k at 20k).
FOLD_CHUNK_RECORDS = 50_000


def partition_chunks(
    groups: Iterable[Mapping[int, Records]], chunk_records: int = FOLD_CHUNK_RECORDS
) -> Iterator[tuple[int, Records]]:
    """Records arriving as ``{partition: records}`` groups (a fetch each), as ``(partition,
    records)`` chunks in offset order: a chunk is yielded once it holds ``chunk_records``
    records, the rest of each partition at the end.

    A partition's chunks must come in offset order, as the source reads them: a record at or
    below an offset already yielded raises, because the fold would skip it as applied.
    """
    pending: dict[int, Records] = {}
    yielded: dict[int, int] = {}

    def ordered(partition: int) -> Records:
        records = pending.pop(partition)
        records.sort(key=_offset)
        first, last = records[0][0], records[-1][0]
        if first <= yielded.get(partition, -1):
            raise RuntimeError(
                f"partition {partition}: offset {first} arrived after offset "
                f"{yielded[partition]} was folded; the source must read in offset order"
            )
        yielded[partition] = last
        return records

    for group in groups:
        for partition, records in group.items():
            if not records:
                continue
            held = pending.setdefault(partition, [])
            held.extend(records)
            if len(held) >= chunk_records:
                yield partition, ordered(partition)
    for partition in sorted(pending):
        yield partition, ordered(partition)


def _offset(item: tuple[int, EventRecord]) -> int:
    return item[0]


class Folded(NamedTuple):
    """One partition's records folded, its changed values sent to the changelog and not yet
    committed: :func:`commit_folded` commits it once the changelog records are acknowledged."""

    writer: PartitionWriter
    applied: int
    last_offset: int
    changelog: ChangelogTarget | None
    landed: list[int]  # changelog offsets, filled in by delivery reports
    errors: list[str]
    late: int = 0  # records a windowed store dropped as late


def fold_partition(
    projection: Projection,
    writer: PartitionWriter,
    records: Records,
    changelog: ChangelogTarget | None,
) -> tuple[int, int] | None:
    """Fold ``records`` (one partition, offset order) into ``writer``, wait for the changelog's
    acknowledgements and commit; returns (applied, offset)."""
    folded = fold_and_send(projection, writer, records, changelog)
    if folded is None:
        return None
    await_changelog([folded])
    return commit_folded(folded)


def fold_and_send(
    projection: Projection,
    writer: PartitionWriter,
    records: Records,
    changelog: ChangelogTarget | None,
) -> Folded | None:
    """Fold the records of ``records`` not applied yet into ``writer`` (uncommitted) and queue
    every changed key's new value for the changelog; None when all were applied already."""
    applied_offset = writer.applied_offset()
    fresh = records
    if applied_offset is not None:
        fresh = records[bisect.bisect_right(records, applied_offset, key=_offset) :]
    if not fresh:
        return None
    if isinstance(projection, OrderedStore):
        chunk = projection.fold_chunk(writer, fresh)
        return send_changes(writer, fresh, chunk.changed, changelog, applied_offset, chunk.late)
    changed: dict[bytes, bytes | None] = {}
    apply, get = projection.apply, writer.get
    for _, record in fresh:
        new_value = apply(get(record.key), record)
        if new_value is None:
            writer.delete(record.key)
        else:
            writer.put(record.key, new_value)
        changed[record.key] = new_value
    return send_changes(writer, fresh, changed, changelog, applied_offset)


def send_changes(
    writer: PartitionWriter,
    fresh: Records,
    changed: dict[bytes, bytes | None],
    changelog: ChangelogTarget | None,
    applied_offset: int | None,
    late: int = 0,
) -> Folded:
    """Queue the ``changed`` values (None: deleted) that folding ``fresh`` into ``writer``
    left for the changelog, as one batch; the :class:`Folded` to commit once they land."""
    if not changed:
        changelog = None  # nothing to copy: the batch moves the stored source offset only
    folded = Folded(writer, len(fresh), fresh[-1][0], changelog, [], [], late)
    if changelog is None:
        return folded
    last_offset = folded.last_offset
    producer, topic, partition, epoch, source_id = changelog
    headers = [
        (SOURCE_OFFSET_HEADER, str(last_offset).encode()),
        (FOLDED_FROM_HEADER, str(-1 if applied_offset is None else applied_offset).encode()),
        (EPOCH_HEADER, str(epoch).encode()),
    ]
    if source_id is not None:
        headers.append((SOURCE_ID_HEADER, source_id.encode()))
    # The first record opens the batch and the last closes it: a copy applies a batch only
    # once it has all of it.
    opening, closing = (BATCH_START_HEADER, b"1"), (BATCH_END_HEADER, b"1")
    first_key, last_key = next(iter(changed)), next(reversed(changed))
    marked = {first_key: [*headers, opening]}
    marked[last_key] = [*marked.get(last_key, headers), closing]

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            folded.errors.append(str(error))
        else:
            folded.landed.append(message.offset())

    for key, value in changed.items():
        produce_when_room(
            producer,
            topic,
            wait_s=0.01,
            key=key,
            value=value,
            partition=partition,
            headers=marked.get(key, headers),
            on_delivery=on_delivery,
        )
    return folded


def await_changelog(folded: Iterable[Folded]) -> None:
    """Wait until the changelog records of ``folded`` are all acknowledged (one wait for all
    of them: their partitions' acknowledgements come back in the same round trips), or raise
    :class:`BrokerUnavailable`."""
    waiting = [(f, f.changelog) for f in folded if f.changelog is not None]
    unsent = sum(p.flush(CHANGELOG_ACK_TIMEOUT_S) for p in {t.producer for _, t in waiting})
    failed = [(f, t) for f, t in waiting if f.errors]
    if unsent or failed:
        where = ", ".join(f"{t.topic}/{t.partition}" for _, t in failed)
        errors = [e for f, _ in failed for e in f.errors][:3]
        raise BrokerUnavailable(
            f"changelog not acknowledged ({unsent} records unsent; {where or 'none'} failed): "
            f"{errors}"
        )


def commit_folded(folded: Folded) -> tuple[int, int]:
    """Commit ``folded`` (values, source offset, changelog position in one write); returns
    (applied, offset)."""
    changelog_offset = None
    if folded.changelog is not None:
        changelog_offset = changelog_position(folded.writer.changelog_offset(), folded.landed)
    folded.writer.commit(folded.last_offset, changelog_offset=changelog_offset)
    return folded.applied, folded.last_offset


def changelog_position(stored: int | None, landed: list[int]) -> int | None:
    """The changelog position to store with the state after its records ``landed``: where a
    copy made from this state resumes following the changelog.

    Right after the last of them when they follow the stored position directly, with nothing
    among them. Records of another writer before or among them (a previous owner writing late,
    a failed task's) are not in this state: the position then stays where it was, so that a
    copy following the changelog from it reads them (fencing and source offsets decide what it
    applies).
    """
    first, last = min(landed), max(landed)
    alone = last - first + 1 == len(landed)  # offsets are unique: nothing else among them
    follows = first == (-1 if stored is None else stored) + 1
    return last if alone and follows else stored


Fetched = TypeVar("Fetched")


def fold_task(
    options: Mapping[str, str],
    fetches: Iterable[Fetched],
    decode: Callable[[Fetched], Mapping[int, Records]],
) -> dict[int, tuple[int, int]]:
    """Fold one Spark task's records (see the module docstring), which arrive as ``fetches``
    that ``decode`` turns into ``{partition: records}``, with the options of
    :class:`~foldstream.projections.datasources.FoldSource`; returns ``{partition: (records
    applied, last offset)}``. The time of each step and the records handled go to the store
    host (:mod:`~foldstream.projections.task_steps`)."""
    from foldstream.service import load_service

    store = options["store"]
    projection = load_service(options["service"]).projection(store)
    host, authkey = options["store_host"], bytes.fromhex(options["store_token"])
    changelog_topic = options.get("changelog_topic")
    producer = _producer(options["bootstrap"]) if changelog_topic else None
    applied: dict[int, tuple[int, int]] = {}
    moved: set[int] = set()
    # Partitions folded, whose changelog records are on their way: one wait for all of their
    # acknowledgements instead of a round trip per partition (a micro-batch's latency).
    pending: dict[int, Folded] = {}

    steps = TaskSteps()
    late = 0

    def settle() -> None:
        nonlocal late
        with steps.step("changelog"):
            await_changelog(pending.values())
        for partition, folded in pending.items():
            try:
                with steps.step("commit"):
                    count, offset = commit_folded(folded)
            except PartitionClosed:
                moved.add(partition)  # see below
                continue
            applied[partition] = (applied.get(partition, (0, offset))[0] + count, offset)
            late += folded.late
        pending.clear()

    handled = 0
    with gc_paused():
        groups = map(decode, steps.waited(fetches, "input"))
        chunks = partition_chunks(groups, FOLD_CHUNK_RECORDS)
        for partition, records in steps.waited(chunks, "decode"):
            handled += len(records)
            if partition in moved:
                continue
            # A partition's next chunk reads what its previous one wrote: commit that first.
            # Pending chunks are also bounded in records, as chunks are (memory).
            if (
                partition in pending
                or sum(f.applied for f in pending.values()) + len(records) > FOLD_CHUNK_RECORDS
            ):
                settle()
            try:
                with steps.step("read"):
                    keys = projection.read_keys(records)
                    writer = RemotePartition(host, authkey, store, partition, keys)
                changelog = (
                    ChangelogTarget(
                        producer, changelog_topic, partition, writer.epoch, writer.source_id
                    )
                    if producer and changelog_topic
                    else None
                )
                with steps.step("fold"):
                    folded = fold_and_send(projection, writer, records, changelog)
            except PartitionClosed:
                # Moved to another instance since the batch was planned: leave it to the new
                # owner, which resumes from the offset stored with the state.
                moved.add(partition)
                continue
            if folded is not None:
                pending[partition] = folded
        settle()
    try:
        call_host(host, authkey, ("task", store, None, steps.seconds, handled))
        if late:
            call_host(host, authkey, ("late", store, None, late))
    except Exception:  # noqa: BLE001 - the batch is committed: only a metric is lost
        log.warning("could not report the task's steps to the store host", exc_info=True)
    after_task(handled)
    return applied
