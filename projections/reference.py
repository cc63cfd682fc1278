"""A projection folded in plain Python over a whole topic: the reference a store must equal.

No Spark and no RocksDB: the records are read from offset 0 to the end and passed through the
projection's own ``apply``, so the result is what an exactly-once store holds for that topic. A
record ``apply`` fails on (a poison record, dead-lettered or skipped by the store) leaves its
key's value as it was.
"""

from __future__ import annotations

import json
from typing import Any

from foldstream.domain.records import EventRecord
from foldstream.kafka import read_to_end
from foldstream.projections.ordered import OrderedStore
from foldstream.projections.ordered_reference import fold_ordered_topic
from foldstream.projections.projection import Projection


def fold_topic(
    bootstrap: str, projection: Projection, topic: str, partitions: int
) -> dict[str, Any]:
    """``{key: value}`` of every key of ``topic``: the decoded JSON the query API serves, or
    None for a key the projection deleted (the API answers 404 for it). For an ordered or
    windowed store, ``{key: entries or windows}`` as its reads answer them
    (:mod:`~foldstream.projections.ordered_reference`)."""
    if isinstance(projection, OrderedStore):
        return fold_ordered_topic(bootstrap, projection, topic, partitions)
    stored: dict[bytes, bytes | None] = {}
    for batch in read_to_end(bootstrap, topic, partitions):
        for message in batch:
            record = EventRecord.from_message(message)
            if record.key is None:
                continue  # a poison record: its store never folds it
            try:
                stored[record.key] = projection.apply(stored.get(record.key), record)
            except Exception:  # noqa: BLE001 - a poison record leaves the key's value as it was
                continue
    return {k.decode(): None if v is None else json.loads(v) for k, v in stored.items()}
