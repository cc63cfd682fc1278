"""What an ``Idempotency-Key`` costs a command (a scratch measurement, not part of ``make bench``):
``python -m bench.idempotency_cost [--rounds 6] [--commands 2000]``.

A command handler (the inventory example's aggregates, an aggregate store on a real store host,
a broker of its own) takes rounds of ``receive_shipment`` of one item for random products, 64 in
flight at a time, alternately without and with a key. Per command: the CPU of this process (the
event loop, the transactions' and the snapshot writes' threads: the whole command side; not the
broker's), the aggregate store's changelog records, and the bytes of the RocksDB values written.
The index's size at rest is the bytes of its values per key (an entry and its order key).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from foldstream.broker import KafkaCluster
from foldstream.commands import CommandHandler
from foldstream.commands.key_entries import Entry, entry_key, order_key
from foldstream.commands.snapshot_store import SnapshotStore
from foldstream.errors import BrokerUnavailable
from foldstream.examples.inventory import service
from foldstream.kafka import TopicSpec, consumer_config, ensure_topics
from foldstream.settings import AGGREGATE_STORE
from foldstream.state.host import StoreHost

PARTITIONS = 4
IN_FLIGHT = 64
PRODUCTS = 5_000


def changelog_end(bootstrap: str, topic: str) -> int:
    consumer = Consumer(consumer_config(bootstrap))
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


async def one_round(
    handler: CommandHandler, commands: int, keys: list[str] | None, rng: random.Random
) -> None:
    """``commands`` commands, ``IN_FLIGHT`` at a time, each with a new key appended to ``keys``
    (None: without keys); returns once their snapshots are written."""
    pending: set[asyncio.Future[object]] = set()
    for _ in range(commands):
        if len(pending) >= IN_FLIGHT:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        key = None if keys is None else str(uuid.uuid4())
        if key is not None and keys is not None:
            keys.append(key)
        coroutine = handler.handle(
            "product",
            f"cost-{rng.randrange(PRODUCTS)}",
            "receive_shipment",
            {"quantity": 1},
            idempotency_key=key,
        )
        pending.add(asyncio.ensure_future(coroutine))
    await asyncio.gather(*pending)
    while handler._committer._persisting:
        await asyncio.sleep(0.01)


def index_bytes_per_key(host: StoreHost, keys: list[str]) -> float:
    """The bytes of the index's keys and values per keyed command (its entry and order key)."""
    total = 0
    for key in keys:
        for p in range(PARTITIONS):  # the entry is in its command's partition
            held = host.partition(AGGREGATE_STORE, p)
            assert held is not None
            (entry,) = held.get_many([entry_key(key)])
            if entry is not None:
                seq = Entry.model_validate_json(entry).seq
                (named,) = held.get_many([order_key(seq)])
                total += len(entry_key(key)) + len(entry) + len(order_key(seq)) + len(named or b"")
                break
    return total / max(1, len(keys))


async def measure(
    handler: CommandHandler, bootstrap: str, changelog: str, rounds: int, commands: int
) -> list[str]:
    """The rounds, alternately without and with keys, printed; the keys used."""
    rng = random.Random(7)
    await one_round(handler, commands, None, rng)  # warm: the products exist
    cpu: dict[bool, list[float]] = {False: [], True: []}
    records: dict[bool, list[float]] = {False: [], True: []}
    keys: list[str] = []
    for n in range(rounds):
        keyed = n % 2 == 1
        before = changelog_end(bootstrap, changelog)
        started, wall = time.process_time(), time.monotonic()
        await one_round(handler, commands, keys if keyed else None, rng)
        used, took = time.process_time() - started, time.monotonic() - wall
        written = changelog_end(bootstrap, changelog) - before
        cpu[keyed].append(used / commands * 1e6)
        records[keyed].append(written / commands)
        print(
            f"round {n} {'keyed' if keyed else 'plain'}: {cpu[keyed][-1]:.0f} CPU-µs/command, "
            f"{commands / took:.0f} commands/s, {records[keyed][-1]:.2f} changelog records/command"
        )
    for keyed in (False, True):
        print(
            f"{'keyed' if keyed else 'plain'}: median {statistics.median(cpu[keyed]):.0f} "
            f"CPU-µs/command, {statistics.median(records[keyed]):.2f} records/command"
        )
    return keys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--commands", type=int, default=2000)
    options = parser.parse_args()
    with KafkaCluster() as broker, tempfile.TemporaryDirectory() as state:
        topic, changelog = "cost.events", f"cost.events.{AGGREGATE_STORE}.changelog"
        ensure_topics(
            broker.bootstrap,
            [TopicSpec(topic, PARTITIONS), TopicSpec(changelog, PARTITIONS, compact=True)],
        )
        host = StoreHost(state_dir=Path(state))
        host.start()
        for partition in range(PARTITIONS):
            host.open(AGGREGATE_STORE, partition, identity="bench", epoch=1)
        snapshots = SnapshotStore(host, bootstrap=broker.bootstrap, changelog_topic=changelog)
        handler = CommandHandler(
            aggregates=service.aggregates,
            bootstrap=broker.bootstrap,
            topic=topic,
            partitions=PARTITIONS,
            snapshots=snapshots,
        )
        handler.start()
        # A new broker loads its transaction coordinator a while after it answers.
        for attempt in Retrying(
            stop=stop_after_delay(120),
            wait=wait_fixed(1),
            retry=retry_if_exception_type(BrokerUnavailable),
            reraise=True,
        ):
            with attempt:
                handler.assign(range(PARTITIONS))
        keys = asyncio.run(
            measure(handler, broker.bootstrap, changelog, options.rounds, options.commands)
        )
        sample = keys[:: max(1, len(keys) // 500)]
        print(f"index: {index_bytes_per_key(host, sample):.0f} bytes per keyed command")
        handler.close()
        snapshots.close()
        host.stop()


if __name__ == "__main__":
    main()
