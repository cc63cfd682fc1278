"""First benchmark: projection rebuild events/s (beside a plain-consumer reference), API
lookups/s, and freshness (command acknowledged -> value served by the query API).

    make bench            # or: .venv/bin/python bench/run.py --events 200000

Prints a table and writes bench/results/latest.json. Numbers vary with machine load: compare
ratios from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import aiohttp
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from foldstream.broker import EmbeddedBroker
from foldstream.domain import EventCodec
from foldstream.examples.inventory import service
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import (
    TopicSpec,
    ensure_topics,
    producer_config,
    read_to_end,
)
from foldstream.process import InstanceProcess, http
from foldstream.projections.sink import fold_partition
from foldstream.state import RocksDBWriter

PARTITIONS = 4
TOPIC = "inventory.events"


def produce(bootstrap: str, events: int, keys: int) -> None:
    codec = EventCodec()
    producer = Producer(producer_config(bootstrap, linger_ms=20, **{"batch.num.messages": 10000}))
    products = [Product(id=f"sku-{n}") for n in range(keys)]
    sent = 0
    while sent < events:
        product = random.choice(products)
        product.receive_shipment(quantity=random.randint(1, 9))
        for domain_event in product.collect_events():
            record = codec.encode(domain_event)
            while True:
                try:
                    producer.produce(
                        TOPIC, key=record.key, value=record.value, headers=list(record.headers)
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            sent += 1
    assert producer.flush(60) == 0


def reference_fold(bootstrap: str, state_dir: Path) -> float:
    """Plain confluent-kafka consumer, same fold, one WriteBatch per poll batch and partition."""
    projection = service.projection("stock")
    writers = {
        p: RocksDBWriter(state_dir / f"ref-{p}", identity=f"{TOPIC}/{p}") for p in range(PARTITIONS)
    }
    folded = 0
    started = time.perf_counter()
    for batch in read_to_end(bootstrap, TOPIC, PARTITIONS):
        rows: dict[int, list[dict[str, object]]] = {}
        for message in batch:
            rows.setdefault(message.partition(), []).append(
                {
                    "offset": message.offset(),
                    "key": message.key(),
                    "value": message.value(),
                    "headers": [{"name": n, "value": v} for n, v in message.headers() or ()],
                }
            )
        for partition, partition_rows in rows.items():
            done = fold_partition(projection, writers[partition], partition_rows, None)
            folded += done[0] if done else 0
    elapsed = time.perf_counter() - started
    for writer in writers.values():
        writer.close()
    return folded / elapsed


async def lookups(url: str, keys: int, seconds: float, concurrency: int = 32) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            async with session.get(
                f"{url}/stores/stock/keys/sku-{random.randrange(keys)}"
            ) as response:
                await response.read()
                assert response.status == 200
            done += 1

    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


def freshness(url: str, commands: int) -> list[float]:
    """Seconds from a command's acknowledgement to its value being served, one at a time."""
    delays = []
    for n in range(commands):
        sku = f"fresh-{n % 10}"
        path = f"{url}/commands/product/{sku}/receive_shipment"
        status, body = http("POST", path, {"quantity": 1})
        assert status == 200, body
        acknowledged = time.perf_counter()
        version = body["events"][-1]["version"]
        # receive_shipment adds one item per command: on_hand == version - 1 after this one.
        while True:
            status, body = http("GET", f"{url}/stores/stock/keys/{sku}")
            if status == 200 and body["value"]["on_hand"] == version - 1:
                break
            if time.perf_counter() - acknowledged > 60:
                raise TimeoutError(f"{sku} not served at version {version} after 60s")
            time.sleep(0.002)
        delays.append(time.perf_counter() - acknowledged)
        time.sleep(0.05)
    return sorted(delays)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--freshness-commands", type=int, default=100)
    args = parser.parse_args()
    console = Console()
    results: dict[str, float] = {}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        ensure_topics(broker.bootstrap, [TopicSpec(TOPIC, PARTITIONS)])
        with console.status(f"producing {args.events} events"):
            produce(broker.bootstrap, args.events, args.keys)
        with console.status("reference: plain consumer fold"):
            results["reference fold events/s"] = reference_fold(broker.bootstrap, Path(tmp))
        instance = InstanceProcess(
            bootstrap=broker.bootstrap, state_dir=Path(tmp) / "state", partitions=PARTITIONS
        )
        with instance, console.status("projection rebuild through Spark"):
            while True:
                try:
                    if http("GET", f"{instance.url}/health", timeout=2)[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            up = time.perf_counter()
            instance.wait_ready(timeout=1800)
            results["projection rebuild events/s"] = args.events / (time.perf_counter() - up)
            results["API lookups/s (32 concurrent, client on the same 2 cores)"] = asyncio.run(
                lookups(instance.url, args.keys, seconds=10)
            )
            delays = freshness(instance.url, args.freshness_commands)
            results["freshness p50 s (command ack -> served)"] = delays[len(delays) // 2]
            results["freshness p99 s (command ack -> served)"] = delays[
                min(len(delays) - 1, int(len(delays) * 0.99))
            ]
    results["rebuild ratio vs reference"] = (
        results["projection rebuild events/s"] / results["reference fold events/s"]
    )
    table = Table(
        title=f"foldstream bench: {args.events} events, {args.keys} keys, {PARTITIONS} partitions"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in results.items():
        table.add_row(name, f"{value:,.2f}" if value < 10 else f"{value:,.0f}")
    console.print(table)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
