"""The command side's replay meets records it cannot apply: it skips them, counts them, and
only the aggregate whose event it could not replay refuses commands. Handlers on the inventory
example's aggregates, on the session's broker; no Spark."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.commands import AggregateUnreplayable, CommandHandler
from foldstream.examples.inventory import service
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics, partition_for, producer_config

PARTITIONS = 2
SHIPPED = b"foldstream.examples.inventory.domain:Product.ShipmentReceived"


def key_in(partition: int, prefix: str) -> str:
    return next(
        key
        for key in (f"{prefix}-{n}" for n in range(1000))
        if partition_for(key.encode(), PARTITIONS) == partition
    )


def started_handler(broker: KafkaCluster, topic: str, **settings: int) -> CommandHandler:
    """A command handler of the inventory example on ``topic``, without an aggregate store."""
    handler = CommandHandler(
        aggregates=service.aggregates,
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=PARTITIONS,
        **settings,
    )
    handler.start()
    return handler


def test_replay_skips_what_it_cannot_apply_and_only_that_aggregate_refuses_commands(
    broker: KafkaCluster,
) -> None:
    topic = f"replay-{uuid.uuid4().hex[:8]}.events"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, PARTITIONS)])
    good, bad, late = key_in(0, "good"), key_in(0, "bad"), key_in(0, "late")
    product = Product(id=good)
    product.receive_shipment(3)
    broken = Product(id=bad)
    broken.receive_shipment(1)
    created, shipped = (service.codec.encode(e) for e in broken.collect_events())
    records = [
        *(service.codec.encode(e) for e in product.collect_events()),  # offsets 0, 1
        created,  # 2
        created._replace(value=b"\x00 not json"),  # 3: bad's second event cannot be decoded
        shipped,  # 4: a later event of bad, which cannot be applied without the one before
        (b"junk", b"garbage", None),  # 5: no headers: not a foldstream event
        (None, b"{}", [("event-type", b"os:system"), ("version", b"1")]),  # 6: no key
    ]
    producer = Producer(producer_config(broker.bootstrap))
    for record in records:
        key, value, headers = record[:3]
        producer.produce(topic, key=key, value=value, headers=list(headers or ()), partition=0)
    assert producer.flush(30) == 0

    async def scenario() -> None:
        handler = started_handler(broker, topic)
        try:
            assert await asyncio.to_thread(handler.assign, range(PARTITIONS)) == 3
            assert handler.counts()["replay_skipped"] == 3  # offsets 3, 5 and 6
            with pytest.raises(AggregateUnreplayable) as refused:
                await handler.handle("product", bad, "receive_shipment", {"quantity": 1})
            message = str(refused.value)
            assert f"{topic} partition 0 offset 3" in message, message
            assert "UndecodableRecord: cannot decode event" in message, message
            # The partition's other aggregates, old and new, take commands as usual.
            result = await handler.handle("product", good, "sell", {"quantity": 1})
            assert result.events == [{"type": "Product.ItemsSold", "version": 3, "quantity": 1}]
            await handler.handle("product", late, "receive_shipment", {"quantity": 1})
        finally:
            handler.close()

    asyncio.run(scenario())


def test_without_an_aggregate_store_a_replay_of_many_aggregates_keeps_them_all(
    broker: KafkaCluster,
) -> None:
    """A command side without snapshots keeps every aggregate in memory: a replay past the
    number of aggregates after which a replay writes snapshots must neither fail nor drop
    any (it failed at the first such checkpoint, and the partition was never taken)."""
    topic = f"replay-many-{uuid.uuid4().hex[:8]}.events"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, PARTITIONS)])
    # Above the 1,000 dirty aggregates after which a replay with a cache this small writes.
    skus = [
        s for s in (f"sku-{n}" for n in range(3_000)) if partition_for(s.encode(), PARTITIONS) == 0
    ]
    count = len(skus)
    producer = Producer({**producer_config(broker.bootstrap), "linger.ms": 20})
    for sku in skus:
        product = Product(id=sku)
        product.receive_shipment(1)
        for key, value, headers in (service.codec.encode(e)[:3] for e in product.collect_events()):
            producer.produce(topic, key=key, value=value, headers=list(headers), partition=0)
    assert producer.flush(30) == 0

    async def scenario() -> None:
        handler = started_handler(broker, topic, cache_size=100)
        try:
            assert await asyncio.to_thread(handler.assign, [0]) == 2 * count
            for sku in (skus[0], skus[count // 2], skus[-1]):
                result = await handler.handle("product", sku, "sell", {"quantity": 1})
                assert result.events == [
                    {"type": "Product.ItemsSold", "version": 3, "quantity": 1}
                ], sku
        finally:
            handler.close()

    asyncio.run(scenario())
