"""Ordered and windowed stores computed in plain Python over a whole topic: what their range and
windows reads must answer (:func:`foldstream.projections.reference.fold_topic` calls it).

Written apart from the stores' own fold (no stored keys, no RocksDB, no chunks): windows are
found, closed and expired here by restating the rules of :mod:`~foldstream.projections.windows`
over dictionaries, record by record in each partition's offset order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from foldstream.domain.records import EventRecord
from foldstream.kafka import read_to_end
from foldstream.projections.ordered import OrderedProjection, OrderedStore, stored_json
from foldstream.projections.windows import WindowedAggregate
from foldstream.times import iso_ms, to_epoch_ms


def fold_ordered_topic(
    bootstrap: str, projection: OrderedStore, topic: str, partitions: int
) -> dict[str, list[dict[str, Any]]]:
    """``{routing key: its entries}`` (``{"sort_key", "value"}``, in order) of an ordered
    store, or ``{routing key: its windows}`` (``{"start", "end", "value"}``, oldest first,
    those past retention left out) of a windowed one; keys with none are left out."""
    records = _records(bootstrap, topic, partitions)
    if isinstance(projection, WindowedAggregate):
        return _windows(projection, records)
    assert isinstance(projection, OrderedProjection)
    return _entries(projection, records)


def _records(bootstrap: str, topic: str, partitions: int) -> Iterator[tuple[int, int, EventRecord]]:
    for batch in read_to_end(bootstrap, topic, partitions):
        for message in batch:
            yield message.partition(), message.offset(), EventRecord.from_message(message)


def _entries(
    projection: OrderedProjection, records: Iterator[tuple[int, int, EventRecord]]
) -> dict[str, list[dict[str, Any]]]:
    found: dict[bytes, list[tuple[Any, int, Any]]] = {}
    for _, offset, record in records:
        if record.value is None:
            if projection.topic is not None:
                found.pop(record.key, None)
            continue
        given = projection.entry(projection.event_of(record))
        if given is None:
            continue
        sort_key, value = given
        if projection.sort_key == "time":
            sort_key = to_epoch_ms(sort_key)
        found.setdefault(record.key, []).append((sort_key, offset, json.loads(stored_json(value))))
    return {
        key.decode(): [
            {"sort_key": iso_ms(s) if projection.sort_key == "time" else s, "value": v}
            for s, _, v in sorted(entries, key=lambda e: (e[0], e[1]))
        ]
        for key, entries in found.items()
        if entries
    }


def _windows(
    projection: WindowedAggregate, records: Iterator[tuple[int, int, EventRecord]]
) -> dict[str, list[dict[str, Any]]]:
    size, grace = projection.size_ms, projection.grace_ms
    advance = projection.advance_ms
    stream: dict[int, int] = {}  # per partition: the largest event time seen
    home: dict[bytes, int] = {}  # each key's partition
    windows: dict[tuple[bytes, int], Any] = {}
    for partition, _, record in records:
        if projection.topic is not None and record.value is None:
            continue
        time = projection.event_time(record)
        stream[partition] = max(stream.get(partition, time), time)
        home[record.key] = partition
        start = time - time % advance
        opened = []
        while start + size > time:  # every window holding ``time``, newest first
            if start + size + grace > stream[partition]:
                opened.append(start)
            start -= advance
        event = projection.event_of(record)
        for start in reversed(opened):
            state = projection.fold(windows.get((record.key, start)), event)
            if state is None:
                windows.pop((record.key, start), None)
            else:
                windows[(record.key, start)] = json.loads(json.dumps(state))
    answered: dict[str, list[dict[str, Any]]] = {}
    for (key, start), state in sorted(windows.items()):
        if start + size + projection.retention_ms > stream[home[key]]:
            window = {"start": iso_ms(start), "end": iso_ms(start + size), "value": state}
            answered.setdefault(key.decode(), []).append(window)
    return answered
