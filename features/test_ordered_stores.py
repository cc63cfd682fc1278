"""Ordered stores on the railway bookings example (an instance of its own)."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime

import pytest
from pytest_bdd import parsers, scenarios, then, when

from foldstream.broker import KafkaCluster
from foldstream.client import AsyncFoldstreamClient, FoldstreamClient
from foldstream.process import InstanceProcess, http
from foldstream.reads import read_path
from foldstream.testing.ordered_steps import expected_items
from foldstream.testing.steps import ScenarioState, produce_records
from foldstream.times import iso_ms, to_epoch_ms

scenarios("ordered_stores.feature")


# Each bookings module starts on empty bookings topics (features/steps/bookings_topics.py).
pytestmark = pytest.mark.usefixtures("empty_bookings_topics")


@when(
    parsers.parse(
        'a "{client}" producer writes {count:d} bookings of customer "{key}" to "{topic}"'
    )
)
def many_bookings(
    broker: KafkaCluster,
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


@then(
    parsers.parse(
        'foldstream\'s client reads the entries of "{key}" in store "{store}" from noon, '
        "{limit:d} at a time"
    )
)
def client_pages(instance: InstanceProcess, key: str, store: str, limit: int) -> None:
    """``FoldstreamClient.range`` pages from a ``datetime`` at noon of the bookings' day hold
    the afternoon's entries of a plain fold of the topic, as the HTTP pages do."""
    noon = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    every = expected_items(instance, store)[key]
    expected = [e for e in every if to_epoch_ms(e["sort_key"]) >= to_epoch_ms(noon.isoformat())]
    assert 0 < len(expected) < len(every), "the bookings lie on both sides of noon"
    entries: list[dict[str, object]] = []
    with FoldstreamClient(instance.url) as client:
        after = None
        while True:
            page = client.range(store, key, start=noon, limit=limit, after=after)
            assert len(page.entries) <= limit and page.served_by.role == "active"
            entries += [entry.model_dump() for entry in page.entries]
            after = page.next
            if after is None:
                break
    assert entries == expected


@then(parsers.parse('foldstream\'s client reads the same windows of "{key}" in store "{store}"'))
def client_windows(instance: InstanceProcess, key: str, store: str) -> None:
    """Both clients' ``windows``, bounds given as epoch milliseconds, answer what
    ``GET .../windows`` does (the step before checked that against the plain fold): up to
    the last window's start, every window but the last."""
    status, body = http("GET", instance.url + read_path(store, key, "windows"))
    assert status == 200, body
    every = body["windows"]
    assert len(every) >= 2, every
    start, end = to_epoch_ms(every[0]["start"]), to_epoch_ms(every[-1]["start"])
    with FoldstreamClient(instance.url) as client:
        answer = client.windows(store, key, start=start, end=end)
    assert [w.model_dump() for w in answer.windows] == every[:-1]

    async def read_async() -> list[dict[str, object]]:
        async with AsyncFoldstreamClient(instance.url) as client:
            answer = await client.windows(store, key, start=start, end=end)
            return [w.model_dump() for w in answer.windows]

    assert asyncio.run(read_async()) == every[:-1]
