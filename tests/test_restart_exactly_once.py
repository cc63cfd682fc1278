"""Killing the projection mid-stream and restarting it neither loses nor repeats an event."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from foldstream.broker import EmbeddedBroker
from foldstream.domain import EventCodec
from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from foldstream.process import InstanceProcess, http
from tests.kafka_reading import read_topic

PARTITIONS = 4
SKUS = [f"restart-{n}" for n in range(40)]


def produce_events(bootstrap: str, rounds: int, stop: threading.Event) -> None:
    """An upstream writer appending shipments and sales at a steady pace."""
    codec = EventCodec()
    producer = Producer(producer_config(bootstrap))
    products = {sku: Product(id=sku) for sku in SKUS}
    for round_number in range(rounds):
        if stop.is_set():
            break
        for product in products.values():
            product.receive_shipment(quantity=round_number % 7 + 1)
            if round_number % 3 == 2:
                product.sell(quantity=1)
            for domain_event in product.collect_events():
                record = codec.encode(domain_event)
                producer.produce(
                    "inventory.events",
                    key=record.key,
                    value=record.value,
                    headers=list(record.headers),
                )
        producer.poll(0)
        time.sleep(0.02)
    assert producer.flush(30) == 0


def expected_stock(bootstrap: str) -> dict[str, object]:
    codec = EventCodec()
    states: dict[str, object] = {}
    for _, _, key, value, headers in read_topic(bootstrap, "inventory.events", PARTITIONS):
        from foldstream.domain import EventRecord

        record = EventRecord(key, value, tuple(headers))
        states[key.decode()] = fold_stock(states.get(key.decode()), codec.decode(record))  # type: ignore[arg-type]
    return states


def test_kill_and_restart_mid_stream(tmp_path: Path) -> None:
    # A broker of its own: this test defines the whole content of the events topic.
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        ensure_topics(broker.bootstrap, [TopicSpec("inventory.events", PARTITIONS)])
        state = tmp_path / "state"
        stop = threading.Event()
        writer = threading.Thread(target=produce_events, args=(broker.bootstrap, 150, stop))
        instance = InstanceProcess(
            bootstrap=broker.bootstrap, state_dir=state, partitions=PARTITIONS
        )
        instance.start()
        try:
            instance.wait_ready()
            writer.start()
            # Kill once the projection is visibly part-way through the stream.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status, body = http("GET", f"{instance.url}/stores/stock/keys/{SKUS[-1]}")
                if status == 200 and body["value"]["on_hand"] > 20:
                    break
                time.sleep(0.05)
            instance.kill()
            writer.join()
            instance.start()
            instance.wait_ready()
            expected = expected_stock(broker.bootstrap)
            assert len(expected) == len(SKUS)
            served = {}
            for sku in SKUS:
                status, body = http("GET", f"{instance.url}/stores/stock/keys/{sku}")
                assert status == 200, body
                served[sku] = body["value"]
            assert served == expected
        finally:
            stop.set()
            instance.stop()
