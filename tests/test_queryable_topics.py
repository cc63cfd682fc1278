"""Latest-value stores over topics written by other producers (seed 003)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer

from foldstream.broker import EmbeddedBroker
from foldstream.kafka import TopicSpec, ensure_topics, partition_for
from foldstream.process import InstanceProcess, lookup


@pytest.fixture(scope="module")
def prices(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InstanceProcess]:
    ensure_topics(
        broker.bootstrap, [TopicSpec("supplier.prices", 3), TopicSpec("supplier.ratings", 5)]
    )
    state: Path = tmp_path_factory.mktemp("prices") / "state"
    with InstanceProcess(
        bootstrap=broker.bootstrap, state_dir=state, service="foldstream.examples.prices:service"
    ) as instance:
        instance.wait_ready()
        yield instance


def wait_for(instance: InstanceProcess, path: str, expected: tuple[int, object]) -> None:
    store, _, key = path.removeprefix("/stores/").partition("/keys/")
    deadline = time.monotonic() + 90  # first batches are slow on a busy machine
    while (got := lookup(instance.url, store, key)) != expected:
        assert time.monotonic() < deadline, f"{path}: {got}, wanted {expected}"
        time.sleep(0.05)


def test_librdkafka_default_partitioner_topic_is_queryable(
    broker: EmbeddedBroker, prices: InstanceProcess
) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})  # librdkafka's defaults
    landed: dict[bytes, int] = {}
    for n in range(30):
        key = f"item-{n}".encode()
        producer.produce(
            "supplier.prices",
            key=key,
            value=json.dumps({"cents": n * 10}).encode(),
            on_delivery=lambda err, msg: landed.__setitem__(msg.key(), msg.partition()),
        )
    producer.produce("supplier.prices", key=b"item-0", value=json.dumps({"cents": 999}).encode())
    producer.produce("supplier.prices", key=b"item-1", value=None)  # tombstone
    assert producer.flush(30) == 0
    assert all(p == partition_for(k, 3, "consistent") for k, p in landed.items())
    wait_for(
        prices, "/stores/prices/keys/item-0", (200, {"key": "item-0", "value": {"cents": 999}})
    )
    wait_for(
        prices, "/stores/prices/keys/item-1", (404, {"error": "no key 'item-1' in store 'prices'"})
    )
    for n in range(2, 30):
        wait_for(
            prices,
            f"/stores/prices/keys/item-{n}",
            (200, {"key": f"item-{n}", "value": {"cents": n * 10}}),
        )


def test_java_compatible_client_topic_is_queryable(
    broker: EmbeddedBroker, prices: InstanceProcess
) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)  # murmur2, like the Java clients
    futures = [
        producer.send(
            "supplier.ratings", key=f"vendor-{n}".encode(), value=f"{n % 5} stars".encode()
        )
        for n in range(40)
    ]
    producer.flush()
    for n, future in enumerate(futures):
        assert future.get(timeout=10).partition == partition_for(f"vendor-{n}".encode(), 5)
    producer.close()
    for n in range(40):
        wait_for(
            prices,
            f"/stores/ratings/keys/vendor-{n}",
            (200, {"key": f"vendor-{n}", "value": f"{n % 5} stars"}),
        )
