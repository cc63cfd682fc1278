"""The stores part of ``make demo``: records written for services that read other producers'
topics, every store (point, ordered, windowed) read back and compared with a plain-Python
computation, and one ordered store's range between two times shown beside the computation."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from foldstream.kafka import TopicSpec, ensure_topics, produce_when_room, producer_config
from foldstream.process import http
from foldstream.projections.projection import Projection
from foldstream.projections.reference import fold_topic
from foldstream.reads import ITEMS, Read, read_all, read_path
from foldstream.service import Service

#: librdkafka's partitioner that is each declared partitioner (murmur2: the Java clients').
_PRODUCER_PARTITIONER = {"murmur2": "murmur2_random", "consistent": "consistent_random"}


def write_demo_records(bootstrap: str, service: Service, rng: random.Random) -> set[str]:
    """Create the topics ``service.demo`` names and write its records, each topic partitioned
    as the stores reading it declare; returns the keys written."""
    demo = service.demo
    assert demo is not None
    ensure_topics(bootstrap, [TopicSpec(t, n) for t, n in demo.topics.items()])
    partitioners = {p.source_topic(""): p.partitioner for p in service.projections}
    producers: dict[str, Producer] = {}
    keys: set[str] = set()
    for record in demo.records(rng):
        chosen = _PRODUCER_PARTITIONER[partitioners.get(record.topic, "murmur2")]
        producer = producers.get(chosen)
        if producer is None:
            producer = producers[chosen] = Producer(
                producer_config(bootstrap, linger_ms=5, partitioner=chosen)
            )
        produce_when_room(
            producer,
            record.topic,
            key=record.key,
            value=record.value,
            timestamp=record.timestamp or 0,
        )
        keys.add(record.key.decode())
    for producer in producers.values():
        assert producer.flush(60) == 0, "demo records not acknowledged"
    return keys


def expected_stores(
    bootstrap: str, projections: list[Projection], events_topic: str, layout: Mapping[str, int]
) -> dict[str, dict[str, Any]]:
    """``{store: {key: value, or entries, or windows}}`` by a plain fold of each topic."""
    return {
        p.store: fold_topic(
            bootstrap, p, p.source_topic(events_topic), layout[p.source_topic(events_topic)]
        )
        for p in projections
    }


def served(url: str, projection: Projection, key: str) -> Any:
    """What the query API serves for ``key``: its value (None: 404), entries or windows."""
    if projection.kind == "point":
        status, body = http("GET", f"{url}/stores/{projection.store}/keys/{key}")
        return body["value"] if status == 200 else None
    read: Read = "range" if projection.kind == "ordered" else "windows"
    status, items = read_all(url, projection.store, key, read)
    return items if status == 200 else f"{status}: {items}"


def wait_served(
    url: str,
    projections: list[Projection],
    expected: dict[str, dict[str, Any]],
    keys: list[str],
    timeout: float,
) -> dict[str, dict[str, Any]]:
    """Read every key of every store until all match (or ``timeout``); the last reads."""
    deadline = time.monotonic() + timeout
    while True:
        queried = {p.store: {k: served(url, p, k) for k in keys} for p in projections}
        done = all(
            queried[p.store][k] == _expected(expected[p.store], p.kind, k)
            for p in projections
            for k in keys
        )
        if done or time.monotonic() > deadline:
            return queried
        time.sleep(0.05)


def _expected(values: Mapping[str, Any], kind: str, key: str) -> Any:
    return values.get(key, None if kind == "point" else [])


def compare(
    console: Console,
    projections: list[Projection],
    expected: dict[str, dict[str, Any]],
    queried: dict[str, dict[str, Any]],
    keys: list[str],
    title: str,
) -> int:
    """Print the stores' values (entries and windows in short) beside the plain fold's;
    returns the mismatches."""
    table = Table(title=title)
    for column in ("store", "key", "folded from the topic", "queried", ""):
        table.add_column(column)
    mismatches = 0
    for projection in projections:
        store = projection.store
        for key in keys:
            want = _expected(expected[store], projection.kind, key)
            got = queried[store].get(key)
            mismatches += want != got
            table.add_row(
                store,
                key,
                _short(want),
                _short(got),
                "[green]ok" if want == got else "[red]MISMATCH",
            )
    console.print(table)
    return mismatches


def _short(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} items" + (f", first {value[0]}" if value else "")
    return str(value)


def show_range(
    console: Console, url: str, projection: Projection, entries: Mapping[str, list[Any]]
) -> bool:
    """The range of the key with the most entries, between the sort keys of its second and
    its last entry (``to`` exclusive), beside the plain computation's entries in that span."""
    key = max(entries, key=lambda k: len(entries[k]), default=None)
    if key is None or len(entries[key]) < 3:
        return True
    low, high = entries[key][1]["sort_key"], entries[key][-1]["sort_key"]
    wanted = [e for e in entries[key] if low <= e["sort_key"] < high]
    status, body = http(
        "GET", url + read_path(projection.store, key, "range", from_=low, to=high, limit=1000)
    )
    got = body.get(ITEMS["range"]) if status == 200 else body
    table = Table(title=f"{projection.store} of {key} from {low} to {high} (to excluded)")
    for column in ("sort key", "value queried", "= plain computation"):
        table.add_column(column)
    for n, entry in enumerate(wanted):
        queried = got[n] if isinstance(got, list) and n < len(got) else None
        same = "[green]yes" if queried == entry else "[red]no"
        shown = json.dumps(queried["value"]) if queried else "-"
        table.add_row(str(entry["sort_key"]), shown, same)
    console.print(table)
    ok = got == wanted
    console.print(
        f"{'[green]' if ok else '[red]'}{len(wanted)} entries between the two times, "
        + ("as computed" if ok else f"but the store answered {got}")
    )
    return ok
