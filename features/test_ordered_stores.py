"""Ordered stores on the railway bookings example (an instance of its own)."""

from __future__ import annotations

import json
import random

from pytest_bdd import parsers, scenarios, when

from foldstream.broker import EmbeddedBroker
from foldstream.testing.steps import ScenarioState, produce_records
from foldstream.times import iso_ms, to_epoch_ms

scenarios("ordered_stores.feature")


@when(
    parsers.parse(
        'a "{client}" producer writes {count:d} bookings of customer "{key}" to "{topic}"'
    )
)
def many_bookings(
    broker: EmbeddedBroker,
    scenario_state: ScenarioState,
    client: str,
    count: int,
    key: str,
    topic: str,
) -> None:
    """``count`` bookings at random minutes of one day, a third of them at a time another
    booking has too: entries with equal sort keys must each come once in the pages."""
    rng = random.Random(count)
    start = to_epoch_ms("2026-06-01T00:00:00Z")
    times = [start + rng.randrange(24 * 60) * 60_000 for _ in range(count * 2 // 3)]
    times += rng.choices(times, k=count - len(times))
    rows = [["key", "value"]] + [
        [key, json.dumps({"trip": f"trip-{n}", "booked_at": iso_ms(at)})]
        for n, at in enumerate(times)
    ]
    produce_records(broker, scenario_state, client, topic, rows)
