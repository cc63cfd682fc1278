"""Rebuilding a partition's aggregates from the events topic, which no record can stop.

A replay reads a partition from the position of its aggregates' snapshots on (from offset 0
without an aggregate store, or without snapshots yet) to its end, and applies each event to its
aggregate (:mod:`.aggregates`), loaded from the store when it is not in memory; it writes the
aggregates it rebuilt to the store as it goes.

Anyone may write to the events topic, so a replay meets records that are not foldstream
events (no key, no headers, garbage) and events it cannot decode or apply (a type that is not
one of the service's events, a value that is not its JSON, a version out of order). It skips
each, logs and counts it; an event's aggregate is then left out (its state is unknown) and
answers commands with :class:`~.unreplayable.AggregateUnreplayable`, naming the record and
the cause (kept in the store: :mod:`.unreplayable`). The partition's other aggregates are
replayed as usual.

The keys of keyed commands are indexed as their events are replayed (:mod:`.key_index`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from foldstream.commands.aggregates import PartitionAggregates
from foldstream.commands.unreplayable import AggregateUnreplayable, Broken
from foldstream.domain import EventCodec, EventRecord
from foldstream.domain.records import HEADER_TYPE
from foldstream.kafka import BOUNDED_PREFETCH_KBYTES, read_partitions_to_end

log = logging.getLogger(__name__)

# Records carrying this header are not domain events; replay skips them.
CONTROL_HEADER = "foldstream-control"
#: Records a replay skips that it logs one by one; the rest are counted in one message.
LOGGED_SKIPS = 20


@dataclass
class Replayed:
    """What a replay did: events applied, records skipped, ``{partition: {aggregate id:
    why}}`` of the aggregates it left out, and the offsets it read each partition from."""

    events: int = 0
    skipped: int = 0
    unreplayable: dict[int, dict[str, Broken]] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)  # where each partition was read from


def replay(
    codec: EventCodec,
    bootstrap: str,
    topic: str,
    aggregates: Mapping[int, PartitionAggregates],
    fetch_wait_max_ms: int = 10,
    between_batches: Callable[[], None] = lambda: None,
) -> Replayed:
    """Apply the events of ``topic``'s partitions (the keys of ``aggregates``) from each one's
    :meth:`~PartitionAggregates.replay_start` to the end to the partition's aggregates,
    decoded with ``codec``. ``between_batches()`` runs before each batch read: it may raise to
    end the replay."""
    done = Replayed()
    starts = {p: target.replay_start() for p, target in aggregates.items()}
    done.starts = dict(starts)
    last: dict[int, int] = {}
    batches = read_partitions_to_end(
        bootstrap,
        topic,
        starts,
        fetch_wait_max_ms=fetch_wait_max_ms,
        # applying events is far slower than reading them
        prefetch_kbytes=BOUNDED_PREFETCH_KBYTES,
    )
    for batch in batches:
        between_batches()
        for message in batch:
            partition, offset = message.partition(), message.offset()
            last[partition] = offset
            _replay_record(codec, topic, aggregates[partition], message, done)
        for partition in {m.partition() for m in batch}:
            aggregates[partition].checkpoint(last[partition])
    for partition, target in aggregates.items():
        target.finish(last.get(partition))
    done.unreplayable = {p: dict(t.broken) for p, t in aggregates.items() if t.broken}
    if done.skipped > LOGGED_SKIPS:
        log.warning("replay of %s %s skipped %d records", topic, sorted(aggregates), done.skipped)
    return done


def _replay_record(
    codec: EventCodec, topic: str, target: PartitionAggregates, message: Any, done: Replayed
) -> None:
    record = EventRecord.from_message(message)
    if record.header(CONTROL_HEADER) is not None:
        return
    offset = message.offset()
    aggregate_id = _aggregate_id(record)
    if not target.replays(offset, aggregate_id):
        return  # in the snapshots already, or its state is unknown since an earlier event
    try:
        domain_event = codec.decode(record)
        key = record.key.decode()
        target.replayed(key, domain_event.mutate(target.replayed_state(key)))
    except AggregateUnreplayable:
        done.skipped += 1  # marked in the store since an earlier replay
        return
    except Exception as exc:  # noqa: BLE001 - one record never stops a replay
        done.skipped += 1
        where = f"{topic} partition {target.partition} offset {offset}"
        reason = _skipped(where, record, aggregate_id, exc, done.skipped <= LOGGED_SKIPS)
        if reason is not None and aggregate_id is not None:
            target.broke(aggregate_id, reason, offset)
        target.keys.replay_failed(record)
        return
    done.events += 1
    target.keys.replayed(record, offset, domain_event)  # its Idempotency-Key, if it has one


def _aggregate_id(record: EventRecord) -> str | None:
    """The aggregate id a record's key names, or None (no key, or not UTF-8)."""
    try:
        return None if record.key is None else record.key.decode()
    except UnicodeDecodeError:
        return None


def _skipped(
    where: str, record: EventRecord, aggregate_id: str | None, error: Exception, logged: bool
) -> str | None:
    """Log (if ``logged``) a record replay skipped; returns why its aggregate takes no
    commands any more, or None when the record names no aggregate or claims no event type."""
    cause = f"{type(error).__name__}: {str(error)[:500]}"
    if aggregate_id is None or record.header(HEADER_TYPE) is None:
        if logged:
            log.warning("replay skipped the record at %s, not a foldstream event: %s", where, cause)
        return None
    if logged:
        log.error("replay skipped the event of %r at %s: %s", aggregate_id, where, cause)
    return f"its event at {where} could not be replayed: {cause}"
