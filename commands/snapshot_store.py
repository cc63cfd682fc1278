"""The aggregate store: each events partition's aggregate snapshots in a store partition that
the instance's store host holds while it owns the partition, like a projection's.

The cluster treats it as one more store of the events topic (named :data:`AGGREGATE_STORE`,
changelog ``<service>._aggregates.changelog``): a takeover restores the tail of its changelog a
local copy lacks and holds it before the command side takes the partition, other instances keep
standby copies of it, and a copy that does not belong to its topics is rebuilt
(:mod:`foldstream.stale_state`). The command side reads snapshots from the held partition and
writes them as a projection's task writes values: the changed keys to the changelog as one
batch, acknowledged first, then values and source offset (the offset of the last event they
reflect) in one RocksDB write batch (:mod:`foldstream.changelog_batches`).
"""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import Producer

from foldstream.changelog_batches import batch_headers, changelog_position, send_batch
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import producer_config
from foldstream.settings import AGGREGATE_STORE
from foldstream.state.held import HeldPartition, PartitionClosed
from foldstream.state.host import StoreHost

#: How long the command side waits for its snapshots' changelog acknowledgements.
CHANGELOG_ACK_TIMEOUT_S = 30.0
#: The largest snapshot kept (with its key, a changelog record of librdkafka's default
#: ``message.max.bytes`` less room for the headers).
MAX_SNAPSHOT_BYTES = 1_000_000 - 8192


class SnapshotPartition:
    """One held partition of the aggregate store, as the command side reads and writes it."""

    def __init__(self, held: HeldPartition, store: SnapshotStore, partition: int) -> None:
        self._held = held
        self._store = store
        self.partition = partition

    def position(self) -> int | None:
        """The offset of the last event the snapshots reflect (None: none yet)."""
        return self._held.applied_offset()

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._held.get_many(keys)

    def write(self, changes: dict[bytes, bytes | None], offset: int) -> None:
        """Write ``changes`` (a None value deletes) as the state after the event at source
        ``offset``: to the changelog first, acknowledged, then with ``offset`` in one write
        batch. :class:`PartitionClosed` if the partition is no longer held here (nothing is
        written then), :class:`BrokerUnavailable` if the changelog did not acknowledge."""
        state, _ = self._held.read([])
        landed: list[int] = []
        errors: list[str] = []

        def on_delivery(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                landed.append(message.offset())

        headers = batch_headers(offset, state.applied_offset, state.epoch, state.source_id)
        producer = self._store.producer()
        send_batch(
            producer, self._store.changelog_topic, self.partition, changes, headers, on_delivery
        )
        unsent = producer.flush(CHANGELOG_ACK_TIMEOUT_S)
        if unsent or errors or len(landed) != len(changes):
            raise BrokerUnavailable(
                f"snapshots of partition {self.partition} not acknowledged by "
                f"{self._store.changelog_topic} ({unsent} unsent): {errors[:3]}"
            )
        position = changelog_position(state.changelog_offset, landed)
        self._held.write(state.token, state.applied_offset, changes, offset, position)


class SnapshotStore:
    """The aggregate store's partitions that ``host`` holds, written to ``changelog_topic``
    through one idempotent producer (made on first use)."""

    def __init__(self, host: StoreHost, *, bootstrap: str, changelog_topic: str) -> None:
        self.host = host
        self.bootstrap = bootstrap
        self.changelog_topic = changelog_topic
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def partition(self, partition: int) -> SnapshotPartition:
        """The held partition; :class:`PartitionClosed` if the host does not hold it (the
        cluster holds it before it gives the events partition to the command side)."""
        held = self.host.partition(AGGREGATE_STORE, partition)
        if held is None:
            raise PartitionClosed(f"{AGGREGATE_STORE}/{partition} is not held by this instance")
        return SnapshotPartition(held, self, partition)

    def producer(self) -> Producer:
        with self._lock:
            if self._producer is None:
                # A few ms of linger: the partitions' snapshot batches share round trips.
                self._producer = Producer(producer_config(self.bootstrap, linger_ms=2))
            return self._producer

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(CHANGELOG_ACK_TIMEOUT_S)
