"""Ordered and windowed stores: range entries per server CPU-second, and the windowed rebuild.

- **Range entries per server CPU-second**: ``GET /stores/bookings/keys/{customer}/range?limit=
  100`` on an instance of the railway bookings example (every customer has more than 100
  bookings: full pages), its whole process tree's CPU, beside a minimal Starlette + uvicorn app
  iterating the same RocksDB ranges (:mod:`bench.range_server`), in alternated rounds.
- **Windowed rebuild events/s**: the Spark projection of the inventory's ``sales_10m`` folding
  a whole events topic of sales (times moving on, some out of order within the grace, some
  late, windows expiring) into empty stores, beside a single-process plain confluent-kafka
  consumer running the same windowed fold; both stores' windows are compared.
"""

from __future__ import annotations

import json
import random
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka import Producer

from bench import lookups, rebuild
from bench.lookups import Rate, Target
from bench.procs import PeakRss, pid_of
from bench.report import Figure
from bench.run import BenchRun
from bench.servers import ServerProcess
from bench.workload import produce, sales_events
from foldstream.broker import free_port
from foldstream.examples.bookings import BOOKINGS_TOPIC
from foldstream.examples.bookings import PARTITIONS as BOOKING_PARTITIONS
from foldstream.examples.inventory import service as inventory
from foldstream.kafka import TopicSpec, ensure_topics, partition_for, produce_when_room
from foldstream.process import InstanceProcess
from foldstream.settings import Settings
from foldstream.spark import spark_session
from foldstream.state import RocksDBReader, partition_path
from foldstream.state.format import ORDERED_FORMAT
from foldstream.state.ordered_keys import (
    STREAM_TIME,
    decode_int,
    encode_int,
    entry_prefix,
    prefix_end,
)
from foldstream.times import iso_ms, to_epoch_ms

PARTITIONS = 4
WINDOWED = "sales_10m"
PAGE = 100
CUSTOMER = "customer-%06d"


def ordered_figures(run: BenchRun, bootstrap: str) -> list[Figure]:
    return [windowed_rebuild_figure(run, bootstrap), range_figure(run, bootstrap)]


def windowed_rebuild_figure(run: BenchRun, bootstrap: str) -> Figure:
    settings = Settings(
        service="windowed",
        bootstrap_servers=bootstrap,
        state_dir=run.tmp / "windowed",
        partitions=PARTITIONS,
    )
    topic = settings.events_topic
    ensure_topics(
        bootstrap,
        [
            TopicSpec(topic, PARTITIONS),
            TopicSpec(settings.changelog_topic(WINDOWED), PARTITIONS, compact=True),
        ],
    )
    events, keys = run.size["windowed_events"], run.size["windowed_keys"]
    run.step(
        f"producing {events:,} sales over {keys:,} products",
        lambda: produce(bootstrap, topic, sales_events(keys, events)),
    )
    reference_dir = run.tmp / "windowed-reference"
    reference = run.step(
        "reference: plain consumer, same windowed fold",
        lambda: rebuild.reference_fold(bootstrap, topic, PARTITIONS, reference_dir, WINDOWED),
    )
    spark = run.step("starting Spark (local[2])", lambda: spark_session("local[2]", "windowed"))
    try:
        rate, spark_figures = run.step(
            "windowed projection rebuild through Spark",
            lambda: rebuild.spark_rebuild(spark, settings, PARTITIONS, WINDOWED),
        )
    finally:
        spark.stop()
    compared = same_windows(reference_dir, settings.state_dir, keys)
    return Figure(
        f"windowed rebuild events/s ({events:,} sales of {keys:,} products over 2 days, "
        "10-min windows)",
        rate,
        "ev/s",
        reference["events/s"],
        "plain confluent-kafka consumer, same windowed fold, 1 process",
        (">=", 1.0),
        note=(
            f"CPU: {spark_figures['events/CPU-s']:,.0f} ev/CPU-s vs reference "
            f"{reference['events/CPU-s']:,.0f}; windows of {compared} keys equal in both stores"
        ),
        details={**spark_figures, "reference": reference},
    )


def same_windows(one: Path, other: Path, keys: int, samples: int = 300) -> int:
    """Raise unless sampled products have the same windows within retention in both stores;
    returns how many were compared."""
    projection = inventory.projection(WINDOWED)
    readers = [
        [
            RocksDBReader(partition_path(state, WINDOWED, p), table_format=ORDERED_FORMAT)
            for p in range(PARTITIONS)
        ]
        for state in (one, other)
    ]
    try:
        for n in random.Random(1).sample(range(keys), min(samples, keys)):
            key = f"sku-{n:07d}".encode()
            partition = partition_for(key, PARTITIONS)
            found = []
            for each in readers:
                reader = each[partition]
                stream = decode_int(reader.get(STREAM_TIME) or encode_int(0))
                prefix = entry_prefix(key)
                start = prefix + encode_int(projection.first_kept_start(stream))
                found.append(reader.scan(max(start, prefix), prefix_end(prefix), 10_000))
            if found[0] != found[1]:
                raise AssertionError(f"{key!r}: windows differ: {found[0]} vs {found[1]}")
    finally:
        for each in readers:
            for reader in each:
                reader.close()
    return min(samples, keys)


def range_figure(run: BenchRun, bootstrap: str) -> Figure:
    customers, per_customer = run.size["range_customers"], run.size["range_bookings"]
    ensure_topics(bootstrap, [TopicSpec(BOOKINGS_TOPIC, BOOKING_PARTITIONS)])
    run.step(
        f"producing {customers * per_customer:,} bookings of {customers:,} customers",
        lambda: _produce_bookings(bootstrap, customers, per_customer),
    )
    instance = InstanceProcess(
        bootstrap=bootstrap,
        state_dir=run.tmp / "bookings",
        service="foldstream.examples.bookings:service",
        partitions=PARTITIONS,
    )
    load = lookups.Load(
        "GET", f"/stores/bookings/keys/{{key}}/range?limit={PAGE}", customers, CUSTOMER
    )
    with instance, PeakRss(pid_of(instance)) as peak:
        run.step("instance (bookings) folding them", lambda: instance.wait_ready(timeout=3600))
        target = Target("instance", instance.url, pid_of(instance))
        lookups.warm_up(run.wrk, target, load)
        measured = run.step("ranges: instance vs minimal app", lambda: _rounds(run, target, load))
    run.memory["instance serving an ordered store"] = peak
    served, minimal = (lookups.mean_rate(measured[n]) for n in ("instance", "minimal-range"))
    bad = served.non_2xx + minimal.non_2xx
    return Figure(
        f"range entries per server CPU-s ({PAGE} per page, {customers:,} keys)",
        served.per_cpu * PAGE,
        "entries/CPU-s",
        minimal.per_cpu * PAGE,
        "minimal Starlette+uvicorn iterating the same RocksDB range",
        (">=", 1.0),
        note=(
            f"instance tree (API+JVM+workers); API process alone "
            f"{served.per_root_cpu * PAGE:,.0f}/CPU-s; p99 {served.p99_ms:.1f} ms vs "
            f"{minimal.p99_ms:.1f} ms" + (f"; {bad} non-2xx/errors!" if bad else "")
        ),
        details={name: [vars(r) for r in rates] for name, rates in measured.items()},
    )


def _rounds(run: BenchRun, instance: Target, load: lookups.Load) -> dict[str, list[Rate]]:
    with ExitStack() as stack:
        server = stack.enter_context(
            ServerProcess(
                "minimal-range",
                state_dir=run.tmp / "bookings",
                store="bookings",
                partitions=BOOKING_PARTITIONS,
                partitioner="murmur2",
                port=free_port(),
            )
        )
        minimal = Target("minimal-range", server.url, server.pid)
        measured: dict[str, list[Rate]] = {"instance": [], "minimal-range": []}
        for _ in range(run.size["rounds"]):  # alternated: drifting machine load hits both
            for target in (instance, minimal):
                measured[target.name].append(
                    lookups.measure(run.wrk, target, load, run.size["seconds"])
                )
    return measured


def _produce_bookings(bootstrap: str, customers: int, per_customer: int) -> None:
    """Bookings of every customer over a year, in about the order they were made, each record
    stamped with its booking time; murmur2, as the example's producer."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random"}
        | {"queue.buffering.max.messages": 500_000}
    )
    start = to_epoch_ms("2026-01-01T00:00:00Z")
    total = customers * per_customer
    step = 365 * 86_400_000 // total
    for n in range(total):
        at = start + n * step
        value = {"trip": f"trip-{n % 977}", "booked_at": iso_ms(at)}
        produce_when_room(
            producer,
            BOOKINGS_TOPIC,
            key=(CUSTOMER % (n % customers)).encode(),
            value=json.dumps(value).encode(),
            timestamp=at,
        )
    assert producer.flush(120) == 0
