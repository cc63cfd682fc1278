"""A fenced command writer's aborted events are never folded, never reach a changelog (so are
never restored into a copy), never served and never replayed into an aggregate: every reader of
them reads committed records only (docs/decisions.md, "Isolation levels").

Real parts throughout: an inventory instance (Spark, RocksDB, HTTP) on the session's broker,
and a writer of one of its partitions (the partition's ``transactional.id``, as
:class:`~foldstream.commands.writer.PartitionWriter` holds it) whose transaction is open when a
newer owner's ``init_transactions`` fences it and aborts the transaction. Twice:

- while the instance runs: its projection's tail meets the open transaction (and must not plan
  its records), and the instance's replay when it takes the partition back reads over the
  aborted records;
- while it is stopped: once it starts again, its projection's first micro-batch spans the
  aborted records, which the tail (started past them) does not keep, so the task fetches them
  from the broker, and so does its replay.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.changelog import restore
from foldstream.domain import EventCodec
from foldstream.examples.inventory import Product, service
from foldstream.kafka import partition_for, producer_config, read_to_end
from foldstream.preflight import store_layouts
from foldstream.process import InstanceProcess, http
from foldstream.settings import AGGREGATE_STORE, Settings
from foldstream.state import RocksDBReader, partition_path

WAIT_S = 120.0


@pytest.fixture
def running(
    broker: KafkaCluster, tmp_path: Path, foldstream_partitions: int
) -> Iterator[InstanceProcess]:
    instance = InstanceProcess(
        bootstrap=broker.bootstrap,
        state_dir=tmp_path / "instance",
        partitions=foldstream_partitions,
    )
    instance.start()
    try:
        instance.wait_ready()
        yield instance
    finally:
        instance.stop()


class Keys:
    """Aggregate ids: ``sku``, written by the instance and the fenced writer, and ``fresh``,
    written by the fenced writer only, all of one partition; ``other``, of another one."""

    def __init__(self, partitions: int) -> None:
        run = uuid.uuid4().hex[:8]
        ids = (f"aborted-{run}-{n}" for n in range(10_000))
        self.partitions = partitions
        self.sku = next(ids)
        self.partition = self.of(self.sku)
        same = (key for key in ids if self.of(key) == self.partition)
        self.fresh = [next(same), next(same)]
        self.other = next(key for key in ids if self.of(key) != self.partition)

    def of(self, key: str) -> int:
        return partition_for(key.encode(), self.partitions)


def command(
    instance: InstanceProcess, key: str, quantity: int, expected_version: int | None = None
) -> tuple[int, Any]:
    query = "" if expected_version is None else f"?expected_version={expected_version}"
    url = f"{instance.url}/commands/product/{key}/receive_shipment{query}"
    return http("POST", url, {"quantity": quantity})


def accepted(
    instance: InstanceProcess, key: str, quantity: int, expected_version: int
) -> dict[str, Any]:
    """The answer to a command, once the instance (re)took the key's partition: 503 while it
    has not; a 409 says its replay counted events that were never committed."""
    deadline = time.monotonic() + WAIT_S
    while (answer := command(instance, key, quantity, expected_version))[0] == 503:
        assert time.monotonic() < deadline, f"no writer of {key}'s partition: {answer}"
        time.sleep(0.2)
    status, body = answer
    assert status == 200, f"{key} at version {expected_version}: {status} {body}"
    return body  # type: ignore[no-any-return]


def on_hand(instance: InstanceProcess, key: str, token: str | None = None) -> int | None:
    """The ``stock`` store's value of ``key`` (None: no value), including ``token``'s command."""
    query = "" if token is None else f"?consistent_with={urllib.parse.quote(token)}"
    deadline = time.monotonic() + WAIT_S
    while True:
        status, body = http("GET", f"{instance.url}/stores/stock/keys/{key}{query}")
        if status in (200, 404) or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # 503: the command is not folded yet
    assert status in (200, 404), f"{key}: {status} {body}"
    return None if status == 404 else int(body["value"]["on_hand"])


def open_transaction(
    bootstrap: str, partition: int, shipments: dict[str, list[int]], committed: dict[str, list[int]]
) -> Producer:
    """A writer of ``partition`` (its transactional id taken: the instance's writer is fenced)
    with a transaction open: the events of ``shipments`` (a new product's creation first), each
    aggregate's versions following its ``committed`` shipments. Its records are in the log,
    uncommitted; it stays open as a paused writer's would, until someone fences it."""
    writer = Producer(producer_config(bootstrap, **{"transactional.id": writer_id(partition)}))
    writer.init_transactions(30)
    writer.begin_transaction()
    codec = EventCodec()
    for key, quantities in shipments.items():
        product = Product(id=key)
        for quantity in committed.get(key, []):
            product.receive_shipment(quantity)
        if key in committed:
            product.collect_events()  # committed already: not written again
        for quantity in quantities:
            product.receive_shipment(quantity)
        for event in product.collect_events():
            record = codec.encode(event)
            writer.produce(
                f"{service.name}.events",
                key=record.key,
                value=record.value,
                headers=list(record.headers),
                partition=partition,
            )
    assert writer.flush(30) == 0
    return writer


def writer_id(partition: int) -> str:
    """The command side's transactional id of ``partition`` (``commands/writer.py``)."""
    return f"{service.name}.events.{partition}"


def fence(bootstrap: str, partition: int) -> None:
    """Take ``partition``'s writer over as a new owner does (``PartitionWriter.open``): the
    writer before it is fenced, its open transaction aborted."""
    Producer(
        producer_config(bootstrap, **{"transactional.id": writer_id(partition)})
    ).init_transactions(30)


def test_a_fenced_writers_aborted_events_are_never_folded_served_or_replayed(
    running: InstanceProcess, broker: KafkaCluster, tmp_path: Path, foldstream_partitions: int
) -> None:
    instance, keys = running, Keys(foldstream_partitions)
    first = accepted(instance, keys.sku, 5, expected_version=0)  # versions 1-2
    assert on_hand(instance, keys.sku, first["token"]) == 5
    zombie = open_transaction(
        broker.bootstrap, keys.partition, {keys.sku: [1000], keys.fresh[0]: [7]}, {keys.sku: [5]}
    )
    # Committed on another partition after the open transaction's records: once it is folded,
    # the projection has planned past the moment they were in the log.
    other = accepted(instance, keys.other, 1, expected_version=0)
    assert on_hand(instance, keys.other, other["token"]) == 1
    assert (on_hand(instance, keys.sku), on_hand(instance, keys.fresh[0])) == (5, None)
    assert http("GET", f"{instance.url}/ready")[0] == 200
    # The instance's writer of the partition was fenced: the command fails, and the instance
    # takes the partition again (fencing the zombie, aborting its transaction), replaying it.
    second = accepted(instance, keys.sku, 3, expected_version=2)
    assert on_hand(instance, keys.sku, second["token"]) == 8
    assert on_hand(instance, keys.fresh[0]) is None
    del zombie  # fenced: it could not write again

    instance.stop()
    zombie = open_transaction(
        broker.bootstrap, keys.partition, {keys.sku: [2000], keys.fresh[1]: [9]}, {keys.sku: [5, 3]}
    )
    fence(broker.bootstrap, keys.partition)
    instance.start()
    instance.wait_ready()
    third = accepted(instance, keys.sku, 1, expected_version=3)
    assert on_hand(instance, keys.sku, third["token"]) == 9
    assert [on_hand(instance, key) for key in keys.fresh] == [None, None]
    del zombie  # fenced before the restart

    changelogs = changelog_records(broker.bootstrap, foldstream_partitions)
    assert not [r for r in changelogs if any(k.encode() in r[1] for k in keys.fresh)]
    assert restored(broker.bootstrap, tmp_path / "restored", keys) == {
        ("stock", keys.sku): {"on_hand": 9},
        ("stock", keys.fresh[0]): None,
        ("stock", keys.fresh[1]): None,
        (AGGREGATE_STORE, keys.fresh[0]): None,
        (AGGREGATE_STORE, keys.fresh[1]): None,
    }


def changelog_records(bootstrap: str, partitions: int) -> list[tuple[str, bytes]]:
    """(changelog, key) of every record of every store's changelog."""
    layouts = store_layouts(service, Settings(service=service.name, partitions=partitions))
    return [
        (layout.changelog_topic, message.key() or b"")
        for layout in layouts.values()
        for batch in read_to_end(bootstrap, layout.changelog_topic, partitions)
        for message in batch
    ]


def restored(bootstrap: str, state_dir: Path, keys: Keys) -> dict[tuple[str, str], Any]:
    """What copies of the keys' partition restored from the changelogs hold of them, as
    JSON."""
    layouts = store_layouts(service, Settings(service=service.name, partitions=keys.partitions))
    found: dict[tuple[str, str], Any] = {}
    for store, wanted in (("stock", [keys.sku, *keys.fresh]), (AGGREGATE_STORE, keys.fresh)):
        restore(
            bootstrap=bootstrap,
            state_dir=state_dir,
            store=store,
            layout=layouts[store],
            partition=keys.partition,
        )
        reader = RocksDBReader(partition_path(state_dir, store, keys.partition))
        try:
            for key in wanted:
                value = reader.get(key.encode())
                found[(store, key)] = None if value is None else json.loads(value)
        finally:
            reader.close()
    return found
