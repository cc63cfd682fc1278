"""A projection's fold, run inside the Spark task that reads the records.

The stream reader of :class:`~foldstream.projections.datasources.FoldSource`
(:class:`~foldstream.projections.source.FoldStreamReader`) plans micro-batches like any Kafka
source, and each task folds the records of its Kafka partitions where it reads them
(:func:`~foldstream.projections.fold_task.fold_task`, into each store of its query), then hands
Spark one row per partition (records applied, last offset) for
the JVM's ``noop`` sink. Folding in a separate Python sink would cost every task a second
Python worker, and every record a trip through the JVM and two Arrow conversions: ``make
bench`` measures both do-nothing queries, a Python reader into a Python writer and into
``noop``.

For each Kafka partition in a task, in offset order and in chunks of up to
:data:`~foldstream.projections.chunks.FOLD_CHUNK_RECORDS` records as they arrive (so a
rebuild's large micro-batches need no more memory than small ones): skip records at or below
the offset stored with the state (a replayed micro-batch applies nothing twice), fold the rest,
send every changed key's new value to the store's compacted changelog (a tombstone for a
delete) and wait for the acks, then commit values and the source offset in one RocksDB write
batch. A crash between the two steps only re-sends identical changelog values on replay. The
partitions are held open by the instance's :class:`~foldstream.state.host.StoreHost`, which the
task reads and writes over a local connection.

A record the projection cannot fold is a poison record (:mod:`~foldstream.projections.poison`):
tried again a few times, then dead-lettered (queued with the chunk's changelog records, and
acknowledged before the chunk commits), skipped, or the end of the partition's folding in this
instance (its store's ``on_error``).

Stores of a multi-stage graph (a store whose changes others read, a multi-input store, a hidden
forwarder) fold through a :class:`~foldstream.projections.staged.Stage`: forwarded records are
queued with the changelog records, and forwarded records applied already are skipped.
"""

from __future__ import annotations

from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable, UndecodableRecord
from foldstream.projections.chunks import Records, not_applied
from foldstream.projections.ordered import OrderedStore
from foldstream.projections.ordered_fold import fold_ordered, handle_poison
from foldstream.projections.poison import (
    NO_KEY,
    Apply,
    PoisonPolicy,
    ValueTooLarge,
    apply_retried,
)
from foldstream.projections.projection import Projection
from foldstream.projections.staged import Stage
from foldstream.projections.task_output import (
    MAX_VALUE_BYTES,
    ChangelogTarget,
    Folded,
    await_changelog,
    changelog_position,
    send_changes,
)
from foldstream.state import PartitionWriter


def fold_partition(
    projection: Projection,
    writer: PartitionWriter,
    records: Records,
    changelog: ChangelogTarget | None,
) -> tuple[int, int] | None:
    """Fold ``records`` (one partition, offset order) into ``writer``, wait for the changelog's
    acknowledgements and commit; returns (applied, offset). A record error is raised."""
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
    poison: PoisonPolicy | None = None,
    stage: Stage | None = None,
) -> Folded | None:
    """Fold the records of ``records`` not applied yet into ``writer`` (uncommitted) and queue
    every changed key's new value for the changelog; None when all were applied already.

    A record that cannot be folded is tried again, then handled by ``poison`` (raised when it
    is None); with the ``stop`` policy the fold ends before it (:attr:`Folded.stop`). A
    ``stage`` skips forwarded records applied already, and forwards changes.
    """
    applied_offset = writer.applied_offset()
    fresh = not_applied(records, applied_offset)
    if not fresh:
        return None
    folded = Folded(writer, changelog)
    if isinstance(projection, OrderedStore):
        changed = fold_ordered(projection, writer, fresh, folded, poison)
    else:
        changed = _fold_points(projection, writer, fresh, folded, poison, stage)
    if changelog is not None and changed:
        send_changes(folded, changelog, changed, applied_offset)
    return folded


def _fold_points(
    projection: Projection,
    writer: PartitionWriter,
    fresh: Records,
    folded: Folded,
    poison: PoisonPolicy | None,
    stage: Stage | None = None,
) -> dict[bytes, bytes | None]:
    changed: dict[bytes, bytes | None] = {}
    apply, get = projection.apply, writer.get
    if stage is not None:
        stage.load(get)
        apply = stage.wrap(apply)
    applied, last_offset = 0, None
    for offset, record in fresh:
        if stage is not None and not stage.admit(offset, record):
            applied, last_offset = applied + 1, offset  # applied already: moved past
            continue
        key = record.key
        current = None if key is None else get(key)  # the store host's errors are not records'
        try:
            new_value = _no_key() if key is None else apply(current, record)
            if len(key) + len(new_value or b"") > MAX_VALUE_BYTES:
                _too_large(key, new_value)
        except BrokerUnavailable:
            raise
        except Exception as error:
            if poison is None:
                raise
            new_value, poisoned = retry_or_handle(
                folded, poison, apply, offset, record, current, error
            )
            if poisoned:
                if folded.stop is not None:
                    break
                if stage is not None:
                    stage.passed()
                applied, last_offset = applied + 1, offset
                continue
        if new_value is None:
            writer.delete(key)
        else:
            writer.put(key, new_value)
        changed[key] = new_value
        if stage is not None:
            stage.folded(folded, record)
        applied, last_offset = applied + 1, offset
    if stage is not None and last_offset is not None:
        changed.update(stage.finish(writer))
    folded.applied, folded.last_offset = applied, last_offset
    return changed


def _no_key() -> bytes | None:
    raise UndecodableRecord(NO_KEY)


def _too_large(key: bytes, value: bytes | None) -> None:
    raise ValueTooLarge(
        f"the value of {key[:100]!r} would take {len(key) + len(value or b'')} bytes with its "
        f"key, more than a changelog record may ({MAX_VALUE_BYTES})"
    )


def retry_or_handle(
    folded: Folded,
    poison: PoisonPolicy,
    apply: Apply,
    offset: int,
    record: EventRecord,
    current: bytes | None,
    error: Exception,
) -> tuple[bytes | None, bool]:
    """``(value, False)`` of a record whose first attempt raised ``error``, once a retry
    succeeds; else ``(None, True)``: the record is poison, handled by the store's policy and
    recorded in ``folded`` (its outcome; where the partition stopped)."""
    try:
        return apply_retried(apply, current, record, error), False
    except BrokerUnavailable:
        raise
    except Exception as final:  # noqa: BLE001 - any error of the record's is the policy's
        handle_poison(folded, poison, offset, record, final)
    return None, True


def commit_folded(folded: Folded) -> tuple[int, int] | None:
    """Commit ``folded`` (values, source offset, changelog position in one write); returns
    (applied, offset), or None when nothing was to commit (stopped at its first record)."""
    if folded.last_offset is None:
        return None
    changelog_offset = None
    if folded.changelog is not None:
        changelog_offset = changelog_position(folded.writer.changelog_offset(), folded.landed)
    folded.writer.commit(folded.last_offset, changelog_offset=changelog_offset)
    return folded.applied, folded.last_offset
