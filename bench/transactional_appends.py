"""Inventory events appended in Kafka transactions, as the command side appends them (a
commit marker after each transaction, which every committed reader steps over): all at once
for a rebuild, or paced for freshness, each event noted with when its transaction committed.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import time
import uuid
from collections.abc import Iterable, Iterator
from multiprocessing.pool import Pool
from typing import Any

from confluent_kafka import Producer

from bench.workload import inventory_events
from foldstream.domain import EventRecord
from foldstream.kafka import producer_config

#: A rebuild's events per transaction: the command side's group commit carries up to 2,000
#: records; a few hundred puts a marker every ~50 records of each of 4 partitions.
REBUILD_TRANSACTION = 200
TRANSACTION_TIMEOUT_S = 60.0

Appended = tuple[int, int, float]
"""``(partition, offset, time.monotonic() when its transaction committed)``."""


def _producer(bootstrap: str) -> Any:
    config = producer_config(bootstrap)
    config["transactional.id"] = f"bench-{uuid.uuid4().hex[:12]}"
    config["queue.buffering.max.messages"] = 100_000
    producer = Producer(config)
    producer.init_transactions(TRANSACTION_TIMEOUT_S)
    return producer


def _commit(producer: Any, topic: str, records: Iterable[EventRecord]) -> list[Appended]:
    """Append ``records`` in one transaction; their partitions and offsets, and when it
    committed."""
    delivered: list[Any] = []
    producer.begin_transaction()
    for record in records:
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
            on_delivery=lambda error, message: delivered.append((error, message)),
        )
    producer.commit_transaction(TRANSACTION_TIMEOUT_S)
    committed = time.monotonic()
    failed = [error for error, _ in delivered if error is not None]
    if failed:
        raise RuntimeError(f"{topic}: {len(failed)} events not appended, the first: {failed[0]}")
    return [(message.partition(), message.offset(), committed) for _, message in delivered]


def append_all(bootstrap: str, topic: str, keys: int, events: int) -> dict[int, int]:
    """Append :func:`~bench.workload.inventory_events` (``keys``, ``events``) in transactions
    of :data:`REBUILD_TRANSACTION`; returns ``{partition: offset of its last event}``."""
    producer = _producer(bootstrap)
    last: dict[int, int] = {}
    stream = inventory_events(keys, events)
    while batch := list(itertools.islice(stream, REBUILD_TRANSACTION)):
        for partition, offset, _ in _commit(producer, topic, batch):
            last[partition] = max(offset, last.get(partition, -1))
    return last


def append_paced(
    bootstrap: str, topic: str, keys: int, rate: float, seconds: float
) -> list[Appended]:
    """Append ``rate`` events a second for ``seconds`` (:func:`~bench.workload.inventory_events`
    over ``keys``), each transaction carrying the events due since the previous one committed
    (group commit: one at a time when the broker keeps up, more when a commit takes longer)."""
    producer = _producer(bootstrap)
    total = int(rate * seconds)
    stream: Iterator[EventRecord] = inventory_events(keys, total)
    appended: list[Appended] = []
    started = time.monotonic()
    while len(appended) < total:
        due = min(total, int((time.monotonic() - started) * rate) + 1)
        if due <= len(appended):
            time.sleep(max(0.0, started + due / rate - time.monotonic()))
            continue
        batch = list(itertools.islice(stream, due - len(appended)))
        appended += _commit(producer, topic, batch)
    return appended


@contextlib.contextmanager
def appender_process() -> Iterator[Pool]:
    """A spawned process for :func:`append_paced`, its imports done on entry: the bench
    process's own threads (the store host, py4j) then do not share its interpreter."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_ready)
        yield pool


def _ready() -> None:
    """Nothing: the spawned process has imported this module once it ran."""
