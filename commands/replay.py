"""Rebuilding a partition's aggregates from the events topic, which no record can stop.

Anyone may write to the events topic, so a replay meets records that are not foldstream
events (no key, no headers, garbage) and events it cannot decode or apply (a type that is not
one of the service's events, a value that is not its JSON, a version out of order). It skips
each, logs and counts it; an event's aggregate is then left out (its state is unknown) and
answers commands with :class:`AggregateUnreplayable`, naming the record and the cause. The
partition's other aggregates are replayed as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from foldstream.domain import Aggregate, EventCodec, EventRecord
from foldstream.domain.records import HEADER_TYPE
from foldstream.errors import FoldstreamError
from foldstream.kafka import read_to_end

log = logging.getLogger(__name__)

# Records carrying this header are not domain events; replay skips them.
CONTROL_HEADER = "foldstream-control"
#: Records a replay skips that it logs one by one; the rest are counted in one message.
LOGGED_SKIPS = 20


class AggregateUnreplayable(FoldstreamError):
    """An event of the aggregate on the events topic could not be replayed (HTTP 409): its
    state is unknown, so no command runs on it; the partition's other aggregates are unaffected.

    Remedy: the message names the record (partition, offset) and the cause. Deploy what decodes
    it (the event class, an upcaster, ``register_topic`` for an old type name), then restart
    the instance (or move the partition) so that it is replayed again.
    """

    def __init__(self, aggregate_id: str, reason: str) -> None:
        super().__init__(f"aggregate {aggregate_id!r} cannot take commands: {reason}")
        self.aggregate_id = aggregate_id


@dataclass
class Replayed:
    """What a replay did: events applied, records skipped, and ``{partition: {aggregate id:
    why}}`` of the aggregates it left out."""

    events: int = 0
    skipped: int = 0
    unreplayable: dict[int, dict[str, str]] = field(default_factory=dict)


def replay(
    codec: EventCodec,
    bootstrap: str,
    topic: str,
    aggregates: Mapping[int, dict[str, Aggregate]],
    fetch_wait_max_ms: int = 10,
    between_batches: Callable[[], None] = lambda: None,
) -> Replayed:
    """Apply every event of ``topic``'s partitions (the keys of ``aggregates``) from offset 0
    to the end to the partition's ``{aggregate id: aggregate}``, decoded with ``codec``.
    ``between_batches()`` runs before each batch read: it may raise to end the replay."""
    done = Replayed()
    broken: dict[int, dict[str, str]] = {p: {} for p in aggregates}
    for batch in read_to_end(bootstrap, topic, aggregates, fetch_wait_max_ms=fetch_wait_max_ms):
        between_batches()
        for message in batch:
            record = EventRecord.from_message(message)
            if record.header(CONTROL_HEADER) is not None:
                continue
            partition = message.partition()
            aggregate_id = _aggregate_id(record)
            if aggregate_id is not None and aggregate_id in broken[partition]:
                continue  # its state is unknown since an earlier event
            replayed = aggregates[partition]
            try:
                _apply(codec, replayed, record)
            except Exception as exc:  # noqa: BLE001 - one record never stops a replay
                done.skipped += 1
                where = f"{topic} partition {partition} offset {message.offset()}"
                reason = _skipped(where, record, aggregate_id, exc, done.skipped <= LOGGED_SKIPS)
                if reason is not None and aggregate_id is not None:
                    broken[partition][aggregate_id] = reason
                    replayed.pop(aggregate_id, None)
                continue
            done.events += 1
    done.unreplayable = {p: ids for p, ids in broken.items() if ids}
    if done.skipped > LOGGED_SKIPS:
        log.warning("replay of %s %s skipped %d records", topic, sorted(aggregates), done.skipped)
    return done


def _apply(codec: EventCodec, aggregates: dict[str, Aggregate], record: EventRecord) -> None:
    domain_event = codec.decode(record)
    key = record.key.decode()
    aggregates[key] = domain_event.mutate(aggregates.get(key))


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
