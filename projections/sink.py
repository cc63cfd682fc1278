"""The Spark streaming sink that folds records into per-partition RocksDB stores.

For each Kafka partition in a task, in offset order: skip records at or below the offset stored
with the state (a replayed micro-batch applies nothing twice), fold the rest, send every changed
key's new value to the store's compacted changelog (a tombstone for a delete) and wait for the
acks, then commit values and the source offset in one RocksDB write batch. A crash between the
two steps only re-sends identical changelog values on replay. The partitions are held open by
the instance's :class:`~foldstream.state.host.StoreHost`, which the sink reads and writes over a
local connection.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Producer
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from foldstream.changelog import BATCH_END_HEADER, SOURCE_OFFSET_HEADER
from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import produce_when_room, producer_config
from foldstream.projections.projection import Projection
from foldstream.projections.source import decode_headers
from foldstream.projections.worker import gc_paused
from foldstream.state import PartitionWriter
from foldstream.state.host import PartitionClosed, RemotePartition

_producers: dict[str, Producer] = {}


def _producer(bootstrap: str) -> Producer:
    # One idempotent producer per reused Python worker.
    producer = _producers.get(bootstrap)
    if producer is None:
        producer = Producer(
            producer_config(
                bootstrap,
                linger_ms=2,
                # A rebuild sends up to a key per record: room for whole micro-batches.
                **{"queue.buffering.max.messages": 1_000_000, "batch.num.messages": 10_000},
            )
        )
        _producers[bootstrap] = producer
    return producer


@dataclass
class FoldResult(WriterCommitMessage):
    """What one task applied: ``{partition: (records applied, last offset)}``."""

    applied: dict[int, tuple[int, int]] = field(default_factory=dict)


Records = list[tuple[int, EventRecord]]
"""``(offset, record)`` pairs of one Kafka partition."""


def records_by_partition(batches: Iterable[pa.RecordBatch]) -> dict[int, Records]:
    """The records of Arrow batches of the source's schema, split by Kafka partition (Spark may
    merge batches of several partitions) and put in offset order.

    Column by column: ``RecordBatch.to_pylist`` builds a dict per row and costs more than the
    fold itself.
    """
    found: dict[int, Records] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        partitions = batch.column("partition").to_pylist()
        offsets = batch.column("offset").to_pylist()
        records = list(
            zip(
                offsets,
                map(
                    EventRecord,
                    batch.column("key").to_pylist(),
                    batch.column("value").to_pylist(),
                    map(decode_headers, batch.column("headers").to_pylist()),
                ),
                strict=True,
            )
        )
        if partitions[0] == partitions[-1] and len(set(partitions)) == 1:
            found.setdefault(partitions[0], []).extend(records)
        else:
            for partition, record in zip(partitions, records, strict=True):
                found.setdefault(partition, []).append(record)
    for records in found.values():
        records.sort(key=_offset)
    return found


def _offset(item: tuple[int, EventRecord]) -> int:
    return item[0]


def fold_partition(
    projection: Projection,
    writer: PartitionWriter,
    records: Records,
    changelog: tuple[Producer, str, int] | None,
) -> tuple[int, int] | None:
    """Fold ``records`` (one partition, offset order) into ``writer``; returns (applied, offset)."""
    applied_offset = writer.applied_offset()
    fresh = records
    if applied_offset is not None:
        fresh = records[bisect.bisect_right(records, applied_offset, key=_offset) :]
    if not fresh:
        return None
    changed: dict[bytes, bytes | None] = {}
    apply, get = projection.apply, writer.get
    for _, record in fresh:
        new_value = apply(get(record.key), record)
        if new_value is None:
            writer.delete(record.key)
        else:
            writer.put(record.key, new_value)
        changed[record.key] = new_value
    last_offset = fresh[-1][0]
    changelog_offset = None
    if changelog is not None:
        producer, topic, partition = changelog
        errors: list[str] = []
        landed: list[int] = []
        headers = [(SOURCE_OFFSET_HEADER, str(last_offset).encode())]
        # The last record closes the batch: a copy applies a batch only once it has all of it.
        closing = [*headers, (BATCH_END_HEADER, b"1")]
        last_key = next(reversed(changed))

        def on_delivery(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                landed.append(message.offset())

        for key, value in changed.items():
            produce_when_room(
                producer,
                topic,
                wait_s=0.01,
                key=key,
                value=value,
                partition=partition,
                headers=closing if key == last_key else headers,
                on_delivery=on_delivery,
            )
        if producer.flush(30) or errors:
            raise BrokerUnavailable(f"changelog {topic}/{partition} not acknowledged: {errors[:3]}")
        # Stored with the state, so a later restore knows where in the changelog to resume.
        changelog_offset = max(landed)
    writer.commit(last_offset, changelog_offset=changelog_offset)
    return len(fresh), last_offset


class StoreStreamWriter(DataSourceStreamArrowWriter):
    """Executor side of :class:`StoreSink`."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FoldResult:
        from foldstream.service import load_service

        store = self.options["store"]
        projection = load_service(self.options["service"]).projection(store)
        host, authkey = self.options["store_host"], bytes.fromhex(self.options["store_token"])
        changelog_topic = self.options.get("changelog_topic")
        result = FoldResult()
        producer = _producer(self.options["bootstrap"]) if changelog_topic else None
        with gc_paused():
            for partition, records in sorted(records_by_partition(iterator).items()):
                changelog = (
                    (producer, changelog_topic, partition) if producer and changelog_topic else None
                )
                try:
                    keys = list(dict.fromkeys(record.key for _, record in records))
                    writer = RemotePartition(host, authkey, store, partition, keys)
                    done = fold_partition(projection, writer, records, changelog)
                except PartitionClosed:
                    # Moved to another instance since the batch was planned: leave it to the new
                    # owner, which resumes from the offset stored with the state.
                    continue
                if done is not None:
                    result.applied[partition] = done
        return result

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task committed its partitions with their offsets."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: committed partitions are consistent, the rest is replayed."""


class StoreSink(DataSource):
    """``writeStream.format("foldstream-store")`` with options ``service`` (import path),
    ``store``, ``store_host`` and ``store_token`` (the :class:`~foldstream.state.host.StoreHost`
    holding its partitions: address and hex key; "token" so that Spark redacts it), ``bootstrap``
    and ``changelog_topic``."""

    @classmethod
    def name(cls) -> str:
        return "foldstream-store"

    def streamWriter(self, schema: Any, overwrite: bool) -> StoreStreamWriter:
        return StoreStreamWriter(dict(self.options))
