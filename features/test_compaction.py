"""Compaction by the broker, on a Kafka node of this module's own whose log cleaner looks for
work every 100 ms, the service's compacted topics set to roll a segment every 100 ms and to be
cleaned at once (tombstones kept 500 ms): what the cleaner leaves is read back, and a store
restored from it is compared with a plain fold of the events."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.broker import KafkaCluster
from foldstream.kafka import partition_for, read_to_end
from foldstream.kafka_client import admin_client
from foldstream.process import InstanceProcess, http
from foldstream.settings import AGGREGATE_STORE, Settings
from foldstream.testing.kafka import log_ends
from foldstream.testing.plugin import InstancePool
from foldstream.testing.scenario import WAIT, lookup, service_of, wait_until

scenarios("compaction.feature")

#: The broker's cleaner looks for dirty logs every 100 ms (Kafka's default: 15 s).
CLEANER = {"log.cleaner.backoff.ms": "100"}
#: The compacted topics' settings: a segment rolls on the first append 100 ms after it began,
#: any dirty share is worth cleaning, records may go as soon as a newer one of their key is
#: cleaned, and tombstones are kept 500 ms once cleaned.
FAST_COMPACTION = {
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "500",
}
#: How often the compaction steps append a record to every changelog partition: later than a
#: segment's 100 ms (so it rolls, and the segments before it can be cleaned) and than a
#: tombstone's 500 ms (so the cleaner has dirty segments to clean after the tombstones expire).
ROLL_EVERY_S = 0.6


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """This module's own Kafka node (its instances use it: ``instances`` asks for ``broker``)."""
    with KafkaCluster(data_dir=tmp_path_factory.mktemp("kafka"), properties=CLEANER) as running:
        yield running


@dataclass
class Compaction:
    """What the scenario's steps leave for the next ones."""

    products: list[str] = field(default_factory=list)
    sold_out: list[str] = field(default_factory=list)
    changelog_records: int = 0  # in the service's changelogs just before the restart
    log_offset: int = 0  # of the instance's log at its restart


@pytest.fixture
def compaction() -> Compaction:
    return Compaction()


def compacted_topics(settings: Settings, stores: list[str]) -> list[str]:
    return [settings.cluster_topic, *(settings.changelog_topic(s) for s in stores)]


def _stores(instance: InstanceProcess) -> list[str]:
    service, _ = service_of(instance)
    return [p.store for p in service.projections] + [AGGREGATE_STORE] * bool(service.aggregates)


@given(
    parsers.parse(
        'the service "{service}" is running on a broker of its own whose log cleaner compacts '
        "within a second"
    ),
    target_fixture="instance",
)
def running_on_a_compacting_broker(instances: InstancePool, service: str) -> InstanceProcess:
    """The instance (which created its topics), then its compacted topics set to
    :data:`FAST_COMPACTION`, as an operator would with ``kafka-configs.sh --alter``."""
    instance = instances.get(service)
    _, settings = service_of(instance)
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                for name, value in FAST_COMPACTION.items()
            ],
        )
        for topic in compacted_topics(settings, _stores(instance))
    ]
    admin = admin_client(instance.bootstrap)  # kept until its futures are done
    for future in admin.incremental_alter_configs(resources).values():
        future.result(timeout=30)
    return instance


def _on_hand(instance: InstanceProcess, product: str) -> int | None:
    status, body = lookup(instance, "in_stock", product)
    return body["value"]["on_hand"] if status == 200 else None


def _wait_on_hand(instance: InstanceProcess, product: str, on_hand: int | None) -> None:
    """Until the store shows ``on_hand`` for ``product`` (None: not in the store)."""
    wait_until(
        lambda: _on_hand(instance, product) == on_hand,
        lambda: f"{product} shows {_on_hand(instance, product)}, not {on_hand}",
    )


def _command(instance: InstanceProcess, product: str, command: str, quantity: int) -> None:
    url = f"{instance.url}/commands/product/{product}/{command}"
    status, body = http("POST", url, {"quantity": quantity})
    assert status == 200, body


@when(
    parsers.parse(
        'products "{prefix}-{first:d}" to "{prefix2}-{last:d}" each receive {count:d} shipments, '
        "each folded before the next"
    )
)
def ship_one_batch_at_a_time(
    instance: InstanceProcess,
    compaction: Compaction,
    prefix: str,
    first: int,
    prefix2: str,
    last: int,
    count: int,
) -> None:
    """Shipment ``n`` of ``n`` items to each product, the next sent once the store shows it:
    each is in a micro-batch, and so a changelog batch, of its own (the products in parallel)."""
    compaction.products = [f"{prefix}-{n}" for n in range(first, last + 1)]
    errors: list[BaseException] = []

    def ship(product: str) -> None:
        try:
            for n in range(1, count + 1):
                _command(instance, product, "receive_shipment", n)
                _wait_on_hand(instance, product, n * (n + 1) // 2)
        except BaseException as exc:  # noqa: BLE001 - raised in the step's thread below
            errors.append(exc)

    threads = [threading.Thread(target=ship, args=(p,)) for p in compaction.products]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@when(parsers.parse('products "{first}" and "{second}" sell all they hold'))
def sell_out(instance: InstanceProcess, compaction: Compaction, first: str, second: str) -> None:
    """Each sells what the store shows it holds: it is deleted from the store."""
    for product in (first, second):
        held = _on_hand(instance, product)
        assert held, f"{product} holds nothing to sell"
        _command(instance, product, "sell", held)
        _wait_on_hand(instance, product, None)
        compaction.sold_out.append(product)


class Roller:
    """Appends a record to every partition of the changelog of ``in_stock`` (a shipment to a
    product of each partition) at most every :data:`ROLL_EVERY_S`: segments roll behind it."""

    def __init__(self, instance: InstanceProcess) -> None:
        self.instance = instance
        partitions = instance.partitions
        ids = (f"roll-{n}" for n in range(10_000))
        by_partition = {partition_for(i.encode(), partitions): i for i in ids}
        self.products = [by_partition[p] for p in range(partitions)]
        self._rolled_at = 0.0

    def roll(self) -> None:
        if time.monotonic() - self._rolled_at >= ROLL_EVERY_S:
            for product in self.products:
                _command(self.instance, product, "receive_shipment", 1)
            self._rolled_at = time.monotonic()


def _records_by_key(instance: InstanceProcess, topic: str, partitions: int) -> Counter[bytes]:
    """How many records of each key ``topic`` holds, as a copy reads it (committed only)."""
    found: Counter[bytes] = Counter()
    for batch in read_to_end(instance.bootstrap, topic, partitions):
        found.update(message.key() for message in batch)
    return found


@then(
    parsers.parse(
        'the broker compacted the changelog of store "{store}": one record of each product left '
        "of the {count:d} or more written, none of a sold-out one"
    )
)
def changelog_compacted(
    instance: InstanceProcess, compaction: Compaction, store: str, count: int
) -> None:
    """Until the cleaner has cleaned every segment but the newest (records keep coming to
    every partition, so each product's records are behind one): one record of each product
    left, and none of a sold-out one once its tombstone's 500 ms are over."""
    _, settings = service_of(instance)
    topic = settings.changelog_topic(store)
    roller = Roller(instance)
    expected = {p.encode(): 0 if p in compaction.sold_out else 1 for p in compaction.products}
    found: Counter[bytes] = Counter()

    def compacted() -> bool:
        roller.roll()
        found.clear()
        found.update(_records_by_key(instance, topic, instance.partitions))
        return {key: found[key] for key in expected} == expected

    wait_until(compacted, lambda: f"{topic} holds {dict(found)}; expected {expected}")
    assert count >= 8  # each product's shipments were a changelog batch each


@then(
    parsers.parse(
        "the broker compacted the cluster topic: at most {kept:d} records of each key left, of "
        "at least {written:d} written"
    )
)
def cluster_topic_compacted(
    instance: InstanceProcess, compaction: Compaction, kept: int, written: int
) -> None:
    """Members' heartbeats (twice a second, under their id) and the assignments: the newest of
    each key, and the one the segment being written holds; the topic's end says how many
    were written."""
    _, settings = service_of(instance)
    topic = settings.cluster_topic
    found: Counter[bytes] = Counter()
    end = 0

    def compacted() -> bool:
        nonlocal end
        end = log_ends(instance.bootstrap, topic, 1)[0]
        found.clear()
        found.update(_records_by_key(instance, topic, 1))
        return end >= written and max(found.values()) <= kept

    wait_until(compacted, lambda: f"{topic} ends at {end} and holds {dict(found)}")
    stores = _stores(instance)
    compaction.changelog_records = sum(
        sum(_records_by_key(instance, settings.changelog_topic(s), instance.partitions).values())
        for s in stores
    )


@when("the instance restarts with its state directory deleted")
def restart_without_state(instance: InstanceProcess, compaction: Compaction) -> None:
    """Stopped, its state directory removed, started again; returns once it is ready."""
    instance.stop()
    shutil.rmtree(instance.state_dir, ignore_errors=True)
    assert not instance.state_dir.exists()
    compaction.log_offset = instance.log_path.stat().st_size if instance.log_path.exists() else 0
    instance.start()
    instance.wait_ready(timeout=WAIT)


@then(
    parsers.parse(
        'it restored store "{store}" from no more records than the compacted changelogs hold'
    )
)
def restored_from_compacted(instance: InstanceProcess, compaction: Compaction, store: str) -> None:
    """Its takeovers restored (their log says how many records) some of what the compacted
    changelogs held before the restart, and nothing else (the cleaner only removes more)."""
    with open(instance.log_path, "rb") as log:
        log.seek(compaction.log_offset)
        since_restart = log.read().decode(errors="replace")
    restored = sum(
        int(n) for n in re.findall(r"after restoring (\d+) changelog records", since_restart)
    )
    assert 0 < restored <= compaction.changelog_records, (
        f"restored {restored} records; the changelogs held {compaction.changelog_records}"
    )
