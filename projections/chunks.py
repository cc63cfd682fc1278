"""A projection task's records: from Kafka messages (or the records a micro-batch was planned
with) to ``{partition: records}``, and then to chunks of one partition's records in offset order
(:func:`partition_chunks`), the unit a task folds and commits."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from foldstream.domain.records import EventRecord
from foldstream.projections.source import Planned

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
#: chunks send fewer, and a rebuild folds more events per CPU-second, but a busy task worker
#: holds more (docs/decisions.md, "Folding in the reader").
FOLD_CHUNK_RECORDS = 20_000


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
        records.sort(key=offset_of)
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


def offset_of(item: tuple[int, EventRecord]) -> int:
    return item[0]


def not_applied(records: Records, applied_offset: int | None) -> Records:
    """The records of ``records`` (in offset order) after ``applied_offset``."""
    if applied_offset is None:
        return records
    return records[bisect.bisect_right(records, applied_offset, key=offset_of) :]
