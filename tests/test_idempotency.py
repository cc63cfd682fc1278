"""Commands sent with an ``Idempotency-Key``: a retry answers the first attempt's outcome and
appends nothing more, from memory, from the aggregate store, and after a takeover that rebuilds
the index from the events; a key reused for another request is refused; keys expire by the
partition's time and by count, deterministically; the HTTP header is validated. Handlers on the
inventory example's aggregates, a real store host (RocksDB), the session's broker and a real
uvicorn; no Spark (the kill -9 of a whole instance is in ``test_idempotency_cluster.py``)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from starlette.applications import Starlette

from foldstream.broker import KafkaCluster
from foldstream.commands import CommandHandler, CommandResult, IdempotencyKeyReused, Retention
from foldstream.commands.http import REPLAYED_HEADER, command_routes
from foldstream.commands.idempotency import HEADER
from foldstream.commands.key_entries import META_KEY, entry_key, order_key
from foldstream.examples.inventory import service
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics, partition_for, producer_config
from foldstream.routing import LocalOnly
from foldstream.settings import AGGREGATE_STORE
from foldstream.testing.asgi import uvicorn_thread
from foldstream.testing.kafka import read_topic
from tests.test_aggregate_store import PARTITIONS
from tests.test_aggregate_store import Stores as AggregateStores

SHIP = "receive_shipment"


def ids_in(partition: int, prefix: str, count: int) -> list[str]:
    keys = (f"{prefix}-{n}" for n in range(10_000))
    return [k for k in keys if partition_for(k.encode(), PARTITIONS) == partition][:count]


def new_topics(broker: KafkaCluster) -> tuple[str, str]:
    topic = f"idem-{uuid.uuid4().hex[:8]}.events"
    changelog = f"{topic}.{AGGREGATE_STORE}.changelog"
    ensure_topics(
        broker.bootstrap,
        [TopicSpec(topic, PARTITIONS), TopicSpec(changelog, PARTITIONS, compact=True)],
    )
    return topic, changelog


class Stores(AggregateStores):
    """The aggregate store's partitions, as :mod:`tests.test_aggregate_store` holds them, read
    back raw."""

    def stored(self, partition: int, keys: list[bytes]) -> list[bytes | None]:
        held = self.host.partition(AGGREGATE_STORE, partition)
        assert held is not None
        return held.get_many(keys)


def started(
    broker: KafkaCluster, topic: str, stores: Stores | None, retention: Retention | None = None
) -> CommandHandler:
    """A handler owning every partition of ``topic`` (replayed), over ``stores``' aggregate
    store (None: without one)."""
    handler = CommandHandler(
        aggregates=service.aggregates,
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=PARTITIONS,
        snapshots=None if stores is None else stores.snapshots,
        retention=retention,
    )
    handler.start()
    handler.assign(range(PARTITIONS))
    return handler


def keyed_records(broker: KafkaCluster, topic: str, key: str) -> list[tuple[int, int]]:
    """(partition, offset) of every record of ``topic`` carrying ``key``'s header."""
    found = []
    for partition, offset, _, _, headers in read_topic(broker.bootstrap, topic, PARTITIONS):
        header = dict(headers).get(HEADER)
        if header is not None and json.loads(header)["key"] == key:
            found.append((partition, offset))
    return found


def ship(
    handler: CommandHandler, product: str, quantity: int, key: str, **options: int
) -> Coroutine[Any, Any, CommandResult]:
    """The coroutine of a keyed ``receive_shipment``."""
    arguments = {"quantity": quantity}
    return handler.handle("product", product, SHIP, arguments, idempotency_key=key, **options)


def test_a_retry_answers_the_first_outcome_from_memory_and_from_the_store(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic, changelog = new_topics(broker)
    product, neighbour = ids_in(0, "p", 2)

    async def first_owner(handler: CommandHandler) -> None:
        first = await ship(handler, product, 5, "k-1")
        assert [e["type"] for e in first.events] == ["Product.Created", "Product.ShipmentReceived"]
        assert await ship(handler, product, 5, "k-1") == replace(first, remembered=True)
        # Two attempts at once: the second waits for the first's transaction, then answers it.
        both = await asyncio.gather(
            ship(handler, product, 3, "k-2"), ship(handler, product, 3, "k-2")
        )
        assert both[0].offset == both[1].offset and both[0].events == both[1].events
        assert sorted(r.remembered for r in both) == [False, True]
        for other, says in [
            (ship(handler, product, 6, "k-1"), "receive_shipment on product 'p-"),
            (ship(handler, product, 5, "k-1", expected_version=2), "other arguments or version"),
            (ship(handler, neighbour, 5, "k-1"), f"receive_shipment on product {product!r}"),
        ]:
            with pytest.raises(IdempotencyKeyReused, match=says):
                await other
        assert handler.version(product) == 3 and handler.version(neighbour) == 0

    async def next_owner(handler: CommandHandler) -> None:
        assert handler.counts()["replayed_events"] == 0  # the index comes from the store
        again = await ship(handler, product, 5, "k-1")
        assert again.remembered and [e["version"] for e in again.events] == [1, 2]
        with pytest.raises(IdempotencyKeyReused):
            await ship(handler, product, 7, "k-2")

    stores = Stores(broker, tmp_path, changelog)
    try:
        handler = started(broker, topic, stores)
        try:
            asyncio.run(first_owner(handler))
        finally:
            handler.close()  # writes the snapshots and the index
        assert None not in stores.stored(0, [entry_key("k-1"), order_key(0), META_KEY])
        handler = started(broker, topic, stores)
        try:
            asyncio.run(next_owner(handler))
        finally:
            handler.close()
    finally:
        stores.close()
    assert len(keyed_records(broker, topic, "k-1")) == 2  # appended once: Created, Received
    assert len(keyed_records(broker, topic, "k-2")) == 1


def test_a_takeover_rebuilds_the_index_from_the_events_past_the_snapshots(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """The keyed command's snapshot and entry never reached the next owner's store (a copy
    taken before them): its replay of the events rebuilds the entry, both events."""
    topic, changelog = new_topics(broker)
    older, product = ids_in(1, "r", 2)
    stores = Stores(broker, tmp_path / "a", changelog)
    handler = started(broker, topic, stores)
    asyncio.run(handler.handle("product", older, SHIP, {"quantity": 1}))
    handler.close()
    stores.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # snapshots up to the unkeyed command

    stores = Stores(broker, tmp_path / "a", changelog)
    handler = started(broker, topic, stores)
    first = asyncio.run(ship(handler, product, 4, "k-r"))
    handler.close()
    stores.close()

    stores = Stores(broker, tmp_path / "b", changelog)
    try:
        handler = started(broker, topic, stores)
        try:
            assert handler.counts()["replayed_events"] == 2
            assert asyncio.run(ship(handler, product, 4, "k-r")) == replace(first, remembered=True)
            with pytest.raises(IdempotencyKeyReused):
                asyncio.run(ship(handler, product, 5, "k-r"))
        finally:
            handler.close()
        assert stores.stored(1, [entry_key("k-r")])[0] is not None  # written by the replay
    finally:
        stores.close()
    assert len(keyed_records(broker, topic, "k-r")) == 2


def test_keys_expire_by_the_partition_s_time_and_by_count(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic, changelog = new_topics(broker)
    product = ids_in(0, "e", 1)[0]
    stores = Stores(broker, tmp_path, changelog)
    try:
        handler = started(broker, topic, stores, Retention(seconds=1.0, max_keys=1000))
        try:
            gone = asyncio.run(ship(handler, product, 1, "t-gone"))
            kept = asyncio.run(ship(handler, product, 2, "t-kept"))
            time.sleep(1.2)  # no keyed command meanwhile: still remembered, the horizon stood
            assert asyncio.run(ship(handler, product, 2, "t-kept")).remembered
            asyncio.run(ship(handler, product, 3, "t-new"))  # moves the horizon past them
            again = asyncio.run(ship(handler, product, 2, "t-kept"))
            assert not again.remembered and again.offset > kept.offset  # applied again
        finally:
            handler.close()
        assert stores.stored(0, [entry_key("t-gone")]) == [None]  # deleted, not only ignored
        assert gone.offset < kept.offset

        handler = started(broker, topic, stores, Retention(seconds=3600, max_keys=3))
        try:
            for n in range(1, 5):
                asyncio.run(ship(handler, product, 10 + n, f"c-{n}"))
            assert asyncio.run(ship(handler, product, 14, "c-4")).remembered
            assert not asyncio.run(ship(handler, product, 11, "c-1")).remembered  # 4 ago: gone
        finally:
            handler.close()
        assert stores.stored(0, [entry_key("c-2")]) == [None]
    finally:
        stores.close()
    assert len(keyed_records(broker, topic, "t-kept")) == 2
    assert len(keyed_records(broker, topic, "c-1")) == 2
    assert len(keyed_records(broker, topic, "c-4")) == 1


def test_without_a_store_the_replay_from_the_start_rebuilds_the_index_and_ignores_forged_keys(
    broker: KafkaCluster,
) -> None:
    topic, _ = new_topics(broker)
    product = ids_in(1, "m", 1)[0]
    handler = started(broker, topic, None)
    first = asyncio.run(ship(handler, product, 2, "m-1"))
    handler.close()
    # Another producer's event under a key header that is no key: replayed, not indexed.
    shipped = Product(id=product)
    shipped.receive_shipment(1)
    event = next(e for e in shipped.collect_events() if type(e).__name__ == "ShipmentReceived")
    record = service.codec.encode(event)
    producer = Producer(producer_config(broker.bootstrap))
    far_ahead = {  # a valid header whose time would expire every key, were it believed
        "key": "m-far",
        "request": "0" * 64,
        "aggregate": "product",
        "command": SHIP,
        "at": 2**53,
    }
    forgeries = [b"{not json", b'{"key": "m 1", "at": 1}', json.dumps(far_ahead).encode()]
    for version, forged in enumerate(forgeries, start=3):
        headers = [(k, v) for k, v in record.headers if k != "version"]
        headers += [("version", str(version).encode()), (HEADER, forged)]
        producer.produce(topic, key=record.key, value=record.value, partition=1, headers=headers)
    assert producer.flush(30) == 0

    handler = started(broker, topic, None)
    try:
        assert handler.counts()["replayed_events"] == 5
        assert asyncio.run(ship(handler, product, 2, "m-1")) == replace(first, remembered=True)
    finally:
        handler.close()


@pytest.fixture(scope="module")
def web(broker: KafkaCluster) -> Iterator[str]:
    """The command routes on a real uvicorn over a handler owning every partition."""
    topic, _ = new_topics(broker)
    handler = started(broker, topic, None)
    try:
        app = Starlette(routes=command_routes(lambda: handler, lambda: LocalOnly(handler.owned)))
        with uvicorn_thread(app) as url:
            yield url
    finally:
        handler.close()


def test_over_http_a_retry_is_marked_and_a_reuse_is_422(web: str) -> None:
    url = f"{web}/commands/product/h-1/{SHIP}"
    first = httpx.post(url, json={"quantity": 1}, headers={"Idempotency-Key": "h-1"})
    assert first.status_code == 200 and REPLAYED_HEADER not in first.headers
    again = httpx.post(url, json={"quantity": 1}, headers={"Idempotency-Key": '"h-1"'})
    assert again.status_code == 200 and again.headers[REPLAYED_HEADER] == "true"
    assert again.content == first.content  # the same events, position and token
    reused = httpx.post(url, json={"quantity": 2}, headers={"Idempotency-Key": "h-1"})
    assert reused.status_code == 422
    assert reused.json()["idempotency_key"] == "h-1" and "a key names one request" in reused.text
    assert httpx.post(url, json={"quantity": 1}).json()["events"][0]["version"] == 3


@pytest.mark.parametrize(
    "keys",
    [[""], ["a" * 129], ["with space"], ["a,b"], ["ключ"], ["k-1", "k-2"]],
    ids=["empty", "long", "space", "comma", "not-ascii", "twice"],
)
def test_a_key_that_is_no_key_is_400_and_appends_nothing(web: str, keys: list[str]) -> None:
    url = f"{web}/commands/product/h-bad-{uuid.uuid4().hex[:8]}/{SHIP}"
    headers = [(b"Idempotency-Key", key.encode()) for key in keys]
    answer = httpx.post(url, json={"quantity": 1}, headers=headers)
    assert answer.status_code == 400 and "Idempotency-Key" in answer.json()["error"], answer.text
    assert httpx.post(url, json={"quantity": 1}).json()["events"][0]["version"] == 1
