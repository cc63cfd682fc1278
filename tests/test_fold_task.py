"""A projection task on real parts, without Spark: fetches of inventory events folded through a
store host into RocksDB, changed values sent to a changelog topic on the broker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from foldstream.broker import EmbeddedBroker
from foldstream.changelog import SOURCE_OFFSET_HEADER
from foldstream.domain import EventCodec
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics
from foldstream.projections import fold
from foldstream.projections.source import Records
from foldstream.projections.task_steps import STEPS
from foldstream.state.host import StoreHost
from foldstream.testing.kafka import read_topic

PARTITIONS = 3


@pytest.fixture
def reports() -> list[tuple[str, dict[str, float], int]]:
    """What tasks reported to the store host of :func:`host`: ``(store, {step: seconds},
    records)``."""
    return []


@pytest.fixture
def host(tmp_path: Path, reports: list[tuple[str, dict[str, float], int]]) -> Iterator[StoreHost]:
    host = StoreHost(
        state_dir=tmp_path,
        on_task=lambda store, steps, records: reports.append((store, steps, records)),
    )
    host.start()
    for partition in range(PARTITIONS):
        host.open("stock", partition, identity=f"t/{partition}", epoch=1)
    yield host
    host.stop()


Fetch = dict[int, Records]


def events(partition: int, offsets: range) -> Fetch:
    """Product ``p<partition>`` created, then one ``receive_shipment(1)`` per further offset."""
    codec, product = EventCodec(), Product(id=f"p{partition}")
    for _ in offsets[1:]:
        product.receive_shipment(1)
    records = [codec.encode(e) for e in product.collect_events()]
    assert len(records) == len(offsets)
    return {partition: list(zip(offsets, records, strict=True))}


def run_task(broker: EmbeddedBroker, host: StoreHost, fetches: list[Fetch]) -> str:
    changelog = f"fold-{uuid.uuid4().hex[:8]}.changelog"
    ensure_topics(broker.bootstrap, [TopicSpec(changelog, PARTITIONS, compact=True)])
    options = {
        "store": "stock",
        "service": "foldstream.examples.inventory:service",
        "store_host": host.address,
        "store_token": host.authkey.hex(),
        "changelog_topic": changelog,
        "bootstrap": broker.bootstrap,
    }
    assert fold.fold_task(options, iter(fetches), dict) == {
        p: (
            sum(len(f.get(p, [])) for f in fetches),
            max(o for f in fetches for o, _ in f.get(p, [])),
        )
        for p in sorted({p for f in fetches for p in f})
    }
    return changelog


def on_hand(host: StoreHost, partition: int) -> int:
    held = host.partition("stock", partition)
    assert held is not None
    value = held.get(f"p{partition}".encode())
    assert value is not None
    return int(json.loads(value)["on_hand"])


def test_a_task_of_several_partitions_commits_each_after_its_changelog_records_landed(
    broker: EmbeddedBroker, host: StoreHost
) -> None:
    fetches = [events(p, range(10 * p, 10 * p + 4 + p)) for p in range(PARTITIONS)]
    changelog = run_task(broker, host, fetches)
    landed = {p: (offset, headers) for p, offset, _, _, headers in read_topic(
        broker.bootstrap, changelog, PARTITIONS
    )}  # fmt: skip
    for partition in range(PARTITIONS):
        held = host.partition("stock", partition)
        assert held is not None
        assert on_hand(host, partition) == 3 + partition
        assert held.applied_offset() == 10 * partition + 3 + partition
        offset, headers = landed[partition]
        assert held.changelog_offset() == offset  # the position follows its own records
        assert dict(headers)[SOURCE_OFFSET_HEADER] == str(held.applied_offset()).encode()


def test_a_partitions_next_chunk_folds_on_what_its_previous_chunk_committed(
    broker: EmbeddedBroker, host: StoreHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fold, "FOLD_CHUNK_RECORDS", 5)
    # Partition 0 arrives in two chunks, with partition 1's records between them.
    [first] = events(0, range(0, 12)).values()
    run_task(broker, host, [{0: first[:6]}, events(1, range(0, 3)), {0: first[6:]}])
    assert (on_hand(host, 0), on_hand(host, 1)) == (11, 2)
    held = host.partition("stock", 0)
    assert held is not None and held.applied_offset() == 11


def test_a_task_reports_the_time_of_each_step_to_the_store_host(
    broker: EmbeddedBroker, host: StoreHost, reports: list[tuple[str, dict[str, float], int]]
) -> None:
    run_task(broker, host, [events(p, range(0, 5)) for p in range(PARTITIONS)])
    [(store, steps, records)] = reports
    assert (store, records) == ("stock", 5 * PARTITIONS)
    assert list(steps) == list(STEPS)
    # Every step was timed: each took some time (the changelog's acknowledgements a broker
    # round trip, reading and committing a round trip to the host).
    assert all(seconds > 0 for seconds in steps.values()), steps
