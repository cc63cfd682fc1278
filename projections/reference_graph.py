"""Every store of a service computed in plain Python from its topics: the reference a cluster's
stores must equal, multi-input stores included (``foldstream demo`` and the features compare
with it).

No Spark, no RocksDB, no repartition topic: each store's source topic is read from offset 0 to
the end and folded with the projection's own ``apply``, and what a store forwards (its changes,
or a hidden forwarder's re-keyed events) is computed with the same code the tasks run
(:class:`~foldstream.projections.emit.Emitter`) and folded by the multi-input stores reading
it, input after input. That is one order of their inputs' records; folds must not depend on
the order (``docs/rekeying-and-joins.md``), so the stores hold the same values whatever order
the cluster applied them in. Poison records are left out, as the stores' policies leave them
(a record whose forwarding raises is the emitting store's poison record).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from foldstream.domain.records import EventRecord
from foldstream.kafka import read_to_end, topic_partitions
from foldstream.kafka_client import admin_client
from foldstream.projections.emit import Emitter, Pending, Target
from foldstream.projections.forwarded import RESERVED, Forwarded, forward_headers
from foldstream.projections.graph import Forwarder, is_hidden, routes, upstream_of
from foldstream.projections.joins import Join
from foldstream.projections.projection import Projection

Stored = dict[bytes, bytes | None]


def ordered(projections: Sequence[Projection]) -> list[Projection]:
    """``projections`` with every store after the stores (and forwarders) it reads."""
    by_store = {p.store: p for p in projections}
    done: dict[str, Projection] = {}

    def visit(projection: Projection) -> None:
        if projection.store in done:
            return
        for upstream in upstream_of(projection):
            visit(by_store[upstream])
        done[projection.store] = projection

    for projection in projections:
        if isinstance(projection, Forwarder):
            visit(projection)
    for projection in projections:
        visit(projection)
    return list(done.values())


def fold_service(
    bootstrap: str, projections: Sequence[Projection], events_topic: str
) -> dict[str, dict[str, Any]]:
    """``{store: {key: value}}`` of every store that is not hidden: the decoded JSON the query
    API serves, None for a key the store deleted (the API answers 404 for it)."""
    graph = routes(projections)
    forwarded: dict[str, list[EventRecord]] = {}
    topics: dict[str, list[tuple[int, int, EventRecord]]] = {}
    stored: dict[str, Stored] = {}
    for projection in ordered(projections):
        targets = [Target(r.join, r.inputs, "", 1) for r in graph.get(projection.store, [])]
        if isinstance(projection, Join):
            records: Iterator[tuple[int, int, EventRecord]] = (
                (0, offset, record)
                for offset, record in enumerate(forwarded.get(projection.store, []))
            )
        else:
            topic = projection.source_topic(events_topic)
            if topic not in topics:
                topics[topic] = list(_read(bootstrap, topic))
            records = iter(topics[topic])
        topic = projection.source_topic(events_topic)
        values, sent = _fold(projection, topic, records, targets)
        stored[projection.store] = values
        for store, more in sent.items():
            forwarded.setdefault(store, []).extend(more)
    return {
        store: {k.decode(): None if v is None else json.loads(v) for k, v in values.items()}
        for store, values in stored.items()
        if not is_hidden(next(p for p in projections if p.store == store))
    }


def _read(bootstrap: str, topic: str) -> Iterator[tuple[int, int, EventRecord]]:
    partitions = topic_partitions(admin_client(bootstrap), topic)
    if not partitions:
        return
    for batch in read_to_end(bootstrap, topic, partitions):
        for message in batch:
            yield message.partition(), message.offset(), EventRecord.from_message(message)


def _fold(
    projection: Projection,
    topic: str,
    records: Iterator[tuple[int, int, EventRecord]],
    targets: Sequence[Target],
) -> tuple[Stored, Mapping[str, list[EventRecord]]]:
    """The values of ``projection`` over ``records``, and what it forwards to each of
    ``targets``: ``{multi-input store: records}``."""
    values: Stored = {}
    sent: dict[str, list[EventRecord]] = {}
    staged = bool(targets) or isinstance(projection, Join)
    for partition, offset, record in records:
        emitter = Emitter(projection.store, topic, partition, targets)
        key = record.key
        try:
            if isinstance(projection, Forwarder):
                pending = emitter.events(record, offset)
            elif key is None or (staged and key.startswith(RESERVED)):
                continue  # a poison record: its store never folds it
            else:
                new_value = projection.apply(values.get(key), record)
                pending = emitter.changes(key, values.get(key), new_value, offset)
                values[key] = new_value
        except Exception:  # noqa: BLE001 - a poison record leaves the values as they were
            continue
        for seq, item in enumerate(pending):
            sent.setdefault(item.target.join.store, []).append(
                _forwarded_record(emitter, item, offset, seq, key or b"")
            )
    return values, sent


def _forwarded_record(
    emitter: Emitter, item: Pending, offset: int, seq: int, upstream_key: bytes
) -> EventRecord:
    headers = forward_headers(
        Forwarded(item.input, item.kind, emitter.origin, (offset, seq), None, upstream_key)
    )
    return EventRecord(item.key, item.value, (*item.headers, *headers))
