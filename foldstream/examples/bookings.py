"""Railway bookings: ``foldstream.examples.bookings:service``, a service without commands over a
topic another producer writes.

``railway.bookings`` (9 partitions) holds one record per booking, keyed by customer id, with
a JSON value ``{"trip": "...", "booked_at": "<ISO-8601>"}``, written by a Java-compatible
producer (murmur2 partitioner) that stamps each record with the booking's time. Stores:

- ``latest_booking``: each customer's latest booking (a latest-value store);
- ``bookings``: each customer's bookings ordered by ``booked_at``, the record's JSON as it is:
  ``GET /stores/bookings/keys/c-1/range?from=2026-05-01T00:00Z&to=2026-05-02T00:00Z``;
- ``trips_per_day``: bookings per customer per day by the records' timestamps (one-day
  tumbling windows, an hour's grace, kept 30 days):
  ``GET /stores/trips_per_day/keys/c-1/windows``.

``foldstream demo --service foldstream.examples.bookings:service`` writes bookings itself
(:data:`service`'s ``demo``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from foldstream.domain.records import EventRecord
from foldstream.projections import LatestValue, OrderedProjection, WindowedAggregate, field_entry
from foldstream.service import DemoRecord, DemoRecords, Service
from foldstream.times import iso_ms, to_epoch_ms

BOOKINGS_TOPIC = "railway.bookings"
PARTITIONS = 9
_CITIES = ("Paris", "Lyon", "Marseille", "Lille", "Bordeaux", "Nantes", "Strasbourg")


def count_trip(state: dict[str, Any] | None, record: EventRecord) -> dict[str, Any]:
    """``trips_per_day``: bookings in a window."""
    return {"bookings": (0 if state is None else state["bookings"]) + 1}


def demo_bookings(
    rng: random.Random, customers: int = 24, bookings: int = 240
) -> Iterator[DemoRecord]:
    """``bookings`` bookings of ``customers`` customers over three days, in about the order
    they were made (a few minutes out of order, within the hour's grace), and a few written
    more than a day late (``trips_per_day`` drops those; ``bookings`` keeps them)."""
    start = to_epoch_ms(datetime(2026, 5, 1, 6, tzinfo=UTC))
    step = timedelta(days=3) // timedelta(milliseconds=1) // bookings
    for n in range(bookings):
        booked_at = start + n * step + rng.randrange(-5 * 60_000, 5 * 60_000)
        if n % 60 == 59:
            booked_at -= 26 * 3600_000  # a booking reported a day late
        origin, destination = rng.sample(_CITIES, 2)
        value = {"trip": f"{origin}-{destination}", "booked_at": iso_ms(booked_at)}
        key = f"customer-{rng.randrange(customers):03d}".encode()
        yield DemoRecord(BOOKINGS_TOPIC, key, json.dumps(value).encode(), booked_at)


service = Service(
    name="bookings",
    projections=[
        LatestValue("latest_booking", topic=BOOKINGS_TOPIC, partitioner="murmur2"),
        OrderedProjection(
            "bookings",
            topic=BOOKINGS_TOPIC,
            sort_key="time",
            entry=field_entry("booked_at"),
            partitioner="murmur2",
        ),
        WindowedAggregate(
            "trips_per_day",
            fold=count_trip,
            size=timedelta(days=1),
            grace=timedelta(hours=1),
            retention=timedelta(days=30),
            topic=BOOKINGS_TOPIC,
            partitioner="murmur2",
        ),
    ],
    demo=DemoRecords(topics={BOOKINGS_TOPIC: PARTITIONS}, records=demo_bookings),
)
