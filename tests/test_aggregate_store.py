"""The command side's aggregate store: snapshots written after each committed transaction, a
bounded cache over them, takeovers that replay only the events past the snapshots, and
expected versions that stay right. Handlers on the inventory example's aggregates, a real
store host (RocksDB) and the session's broker; no Spark."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.commands import CommandHandler, VersionConflict
from foldstream.commands.snapshot_store import SnapshotStore
from foldstream.domain.snapshots import SnapshotCodec, UndecodableSnapshot, UnstorableAggregate
from foldstream.examples.inventory import service
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics, partition_for, producer_config
from foldstream.settings import AGGREGATE_STORE
from foldstream.state.host import StoreHost

PARTITIONS = 2


def ids_in(partition: int, prefix: str, count: int) -> list[str]:
    keys = (f"{prefix}-{n}" for n in range(10_000))
    found = [k for k in keys if partition_for(k.encode(), PARTITIONS) == partition]
    return found[:count]


class Stores:
    """A store host holding both partitions of the aggregate store under ``state_dir``."""

    def __init__(self, broker: KafkaCluster, state_dir: Path, changelog: str) -> None:
        self.host = StoreHost(state_dir=state_dir)
        self.host.start()
        for partition in range(PARTITIONS):
            self.host.open(AGGREGATE_STORE, partition, identity="test", epoch=1)
        self.snapshots = SnapshotStore(
            self.host, bootstrap=broker.bootstrap, changelog_topic=changelog
        )

    def close(self) -> None:
        self.snapshots.close()
        self.host.stop()


def handler_on(broker: KafkaCluster, topic: str, stores: Stores, cache: int) -> CommandHandler:
    handler = CommandHandler(
        aggregates=service.aggregates,
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=PARTITIONS,
        snapshots=stores.snapshots,
        cache_size=cache,
    )
    handler.start()
    return handler


def test_a_takeover_replays_only_past_the_snapshots_and_versions_stay_right(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"snap-{uuid.uuid4().hex[:8]}.events"
    changelog = f"{topic}.{AGGREGATE_STORE}.changelog"
    ensure_topics(
        broker.bootstrap,
        [TopicSpec(topic, PARTITIONS), TopicSpec(changelog, PARTITIONS, compact=True)],
    )
    products = ids_in(0, "p", 5)

    async def first_owner(stores: Stores) -> None:
        handler = handler_on(broker, topic, stores, cache=2)
        try:
            assert await asyncio.to_thread(handler.assign, range(PARTITIONS)) == 0
            for product in products:
                await handler.handle("product", product, "receive_shipment", {"quantity": 5})
            for product in products:  # most are read back from the store: the cache holds 2
                await handler.handle("product", product, "sell", {"quantity": 1})
            aggregates = handler._writer(0).aggregates
            assert aggregates.snapshot_reads > 0
            assert len(aggregates) <= 2 + len(products)  # dirty ones stay until written
        finally:
            handler.close()  # writes the snapshots not written yet

    async def next_owner(stores: Stores, expect_replayed: int, version: int) -> None:
        handler = handler_on(broker, topic, stores, cache=2)
        try:
            await asyncio.to_thread(handler.assign, range(PARTITIONS))
            assert handler.counts()["replayed_events"] == expect_replayed
            with pytest.raises(VersionConflict) as conflict:
                await handler.handle(
                    "product", products[0], "sell", {"quantity": 1}, expected_version=version - 1
                )
            assert conflict.value.current == version
            result = await handler.handle(
                "product", products[0], "sell", {"quantity": 1}, expected_version=version
            )
            assert result.events[0]["version"] == version + 1
        finally:
            handler.close()

    stores = Stores(broker, tmp_path, changelog)
    try:
        asyncio.run(first_owner(stores))
        # Every event is in the snapshots: nothing to replay.
        asyncio.run(next_owner(stores, expect_replayed=0, version=3))
        # An event appended past the snapshots (version 5: by a writer that crashed before
        # writing its snapshot) is replayed, alone: the events topic is the source of truth.
        product = Product(id=products[0])
        product.receive_shipment(1)  # a stand-in event: only the one past the snapshots
        shipped = [e for e in product.collect_events() if type(e).__name__ == "ShipmentReceived"]
        record = service.codec.encode(shipped[0])
        producer = Producer(producer_config(broker.bootstrap))
        headers = [(k, v) for k, v in record.headers if k != "version"] + [("version", b"5")]
        producer.produce(topic, key=record.key, value=record.value, headers=headers, partition=0)
        assert producer.flush(30) == 0
        asyncio.run(next_owner(stores, expect_replayed=1, version=5))
    finally:
        stores.close()


def test_snapshots_round_trip_and_are_upcast() -> None:
    class Counter(Product):
        class_version = 2

        @staticmethod
        def upcast_v1_v2(state: dict[str, object]) -> None:
            state["counted"] = True

    product = Product(id="c-1")
    product.receive_shipment(3)
    old = SnapshotCodec({"counter": Product}).encode(product)
    codec = SnapshotCodec({"counter": Counter})
    restored = codec.decode("c-1", old.replace(b'"counter"', b'"counter"'))
    assert isinstance(restored, Counter)
    assert (restored.id, restored.version, restored.on_hand) == ("c-1", 2, 3)
    assert restored.__dict__["counted"] is True
    again = codec.decode("c-1", codec.encode(restored))
    assert (again.version, again.on_hand) == (2, 3)
    for bad in (b"not json", b"[]", b'{"aggregate": "os.system", "version": 1, "state": {}}'):
        with pytest.raises(UndecodableSnapshot):
            codec.decode("c-1", bad)


def test_a_state_the_transcoder_cannot_encode_has_no_snapshot() -> None:
    product = Product(id="s-1")
    product.__dict__["tags"] = {"a", "b"}  # a set: no JSON for it
    with pytest.raises(UnstorableAggregate, match="cannot be kept as a snapshot"):
        SnapshotCodec({"product": Product}).encode(product)
