"""The log the nemesis checker holds every answer against (``tests/nemesis/run.py``): every
committed event, also one committed behind a transaction still open when the read starts."""

from __future__ import annotations

import json
import threading
import uuid

from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from tests.nemesis.run import read_events


def _writer(bootstrap: str) -> Producer:
    config = producer_config(bootstrap)
    config["transactional.id"] = f"checked-{uuid.uuid4().hex}"
    producer = Producer(config)
    producer.init_transactions(30)
    producer.begin_transaction()
    return producer


def _shipment(producer: Producer, topic: str, quantity: int) -> None:
    headers: list[tuple[str, str | bytes | None]] = [
        ("event-type", b"Product.ShipmentReceived"),
        ("version", b"1"),
    ]
    value = json.dumps({"quantity": quantity}).encode()
    producer.produce(topic, key=f"sku-{quantity}".encode(), value=value, headers=headers)
    assert producer.flush(30) == 0


def test_events_committed_behind_an_open_transaction_are_read(broker: KafkaCluster) -> None:
    """A committed read stops before a transaction still open (until its markers land, a
    transaction whose commit was decided is one too): the log read at once would lack what is
    committed after it, and the stores' answers that include it would look made up."""
    topic = f"checked.{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, 1)])
    open_one, later = _writer(broker.bootstrap), _writer(broker.bootstrap)
    _shipment(open_one, topic, 1)
    _shipment(later, topic, 2)
    later.commit_transaction(30)
    ending = threading.Timer(2.0, open_one.commit_transaction, args=(30,))
    ending.start()
    try:
        events = read_events(broker.bootstrap, 1, topic=topic)
    finally:
        ending.join()
    assert [(e.key, e.quantity) for e in events] == [("sku-1", 1), ("sku-2", 2)]
