"""Event streams for the benchmarks, in exactly the records the command side appends.

Encoding millions of events one aggregate at a time would dominate the run, so each kind of
event is encoded once with :class:`EventCodec` and reused with each key's own id and version
(event values do not hold the aggregate id; headers do).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator

from confluent_kafka import Producer

from foldstream.domain import EventCodec, EventRecord
from foldstream.domain.records import HEADER_ID, HEADER_TIMESTAMP, HEADER_VERSION
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import produce_when_room, producer_config
from foldstream.times import iso_ms, to_epoch_ms

QUANTITIES = 9


def sku(n: int) -> str:
    return f"sku-{n:07d}"


def _templates() -> tuple[EventRecord, list[EventRecord]]:
    """A ``Product.Created`` record and ``ShipmentReceived`` records of quantity 1..9."""
    codec = EventCodec()
    product = Product(id="template")
    for quantity in range(1, QUANTITIES + 1):
        product.receive_shipment(quantity=quantity)
    created, *shipments = (codec.encode(e) for e in product.collect_events())
    return created, shipments


def inventory_events(
    keys: int, events: int, name: Callable[[int], str] = sku
) -> Iterator[EventRecord]:
    """``events`` records over ``keys`` products (product ``n``'s id is ``name(n)``),
    round-robin: every product is created, then receives shipments; product ``n``'s ``v``-th
    shipment holds ``(n + v) % 9 + 1`` items."""
    created, shipments = _templates()
    for n in range(events):
        key, version = n % keys, n // keys + 1
        template = created if version == 1 else shipments[(key + version) % QUANTITIES]
        yield _copy(template, name(key), HEADER_VERSION, str(version).encode())


def sales_events(keys: int, events: int, days: int = 2) -> Iterator[EventRecord]:
    """``events`` sales over ``keys`` products, round-robin, their times moving on evenly over
    ``days`` days (so windows close and expire as they go): every 50th sale is 30 s older than
    its turn (out of order, within a minute's grace), every 997th 15 minutes older (late)."""
    codec = EventCodec()
    product = Product(id="template")
    product.receive_shipment(quantity=QUANTITIES * (QUANTITIES + 1))
    for quantity in range(1, QUANTITIES + 1):
        product.sell(quantity=quantity)
    sales = [codec.encode(e) for e in product.collect_events()][-QUANTITIES:]
    start = to_epoch_ms("2026-05-01T00:00:00Z")
    step = days * 86_400_000 // events
    for n in range(events):
        at = start + n * step - (30_000 if n % 50 == 7 else 0) - (900_000 if n % 997 == 3 else 0)
        yield _copy(sales[n % QUANTITIES], sku(n % keys), HEADER_TIMESTAMP, iso_ms(at).encode())


def _copy(template: EventRecord, key: str, header: str, value: bytes) -> EventRecord:
    """``template`` as the event of ``key``, with its ``header`` set to ``value`` and an
    event id of its own."""
    headers = tuple(
        (name, value)
        if name == header
        else (name, uuid.uuid4().hex.encode())
        if name == HEADER_ID
        else (name, stored)
        for name, stored in template.headers
    )
    return EventRecord(key.encode(), template.value, headers)


def expected_on_hand(key: int, keys: int, events: int) -> int:
    """The stock of product ``key`` after :func:`inventory_events` (``keys``, ``events``)."""
    versions = (events - key + keys - 1) // keys  # events of this key
    return sum((key + v) % QUANTITIES + 1 for v in range(2, versions + 1))


def produce(bootstrap: str, topic: str, records: Iterable[EventRecord]) -> int:
    """Append ``records`` to ``topic`` (partitioned by key, murmur2); returns how many."""
    producer = Producer(
        producer_config(
            bootstrap,
            linger_ms=20,
            **{"batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000},
        )
    )
    sent = 0
    for record in records:
        produce_when_room(
            producer, topic, key=record.key, value=record.value, headers=list(record.headers)
        )
        sent += 1
    if producer.flush(120):
        raise RuntimeError(f"{topic}: not every benchmark record was acknowledged")
    return sent
