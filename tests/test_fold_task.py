"""A projection task on real parts, without Spark: fetches of inventory events folded through a
store host into RocksDB, changed values sent to a changelog topic on the broker; and the
source's reader doing the same for the records it fetches or was planned with."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.changelog import SOURCE_ID_HEADER, SOURCE_OFFSET_HEADER
from foldstream.domain import EventCodec
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from foldstream.offsets import TailRecord
from foldstream.projections import fold_task
from foldstream.projections.chunks import Records
from foldstream.projections.query_groups import store_entries, stores_option
from foldstream.projections.source import (
    FoldStreamReader,
    KafkaRange,
    KafkaRanges,
    read_messages,
)
from foldstream.projections.task_steps import STEPS
from foldstream.state import RocksDBWriter, partition_path
from foldstream.state.format import ORDERED_FORMAT
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


def fold_options(broker: KafkaCluster, host: StoreHost) -> dict[str, str]:
    """The options of a task folding into ``host``'s ``stock``, with a changelog topic of its
    own."""
    changelog = f"fold-{uuid.uuid4().hex[:8]}.changelog"
    ensure_topics(broker.bootstrap, [TopicSpec(changelog, PARTITIONS, compact=True)])
    return {
        "stores": stores_option([{"store": "stock", "changelog_topic": changelog}]),
        "service": "foldstream.examples.inventory:service",
        "store_host": host.address,
        "store_token": host.authkey.hex(),
        "bootstrap": broker.bootstrap,
    }


def run_task(broker: KafkaCluster, host: StoreHost, fetches: list[Fetch]) -> str:
    options = fold_options(broker, host)
    assert fold_task.fold_task(options, iter(fetches), dict) == {
        p: (
            sum(len(f.get(p, [])) for f in fetches),
            max(o for f in fetches for o, _ in f.get(p, [])),
        )
        for p in sorted({p for f in fetches for p in f})
    }
    return str(store_entries(options)[0]["changelog_topic"])


def on_hand(host: StoreHost, partition: int) -> int:
    held = host.partition("stock", partition)
    assert held is not None
    value = held.get(f"p{partition}".encode())
    assert value is not None
    return int(json.loads(value)["on_hand"])


def test_a_task_of_several_partitions_commits_each_after_its_changelog_records_landed(
    broker: KafkaCluster, host: StoreHost
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
    broker: KafkaCluster, host: StoreHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fold_task, "FOLD_CHUNK_RECORDS", 5)
    # Partition 0 arrives in two chunks, with partition 1's records between them.
    [first] = events(0, range(0, 12)).values()
    run_task(broker, host, [{0: first[:6]}, events(1, range(0, 3)), {0: first[6:]}])
    assert (on_hand(host, 0), on_hand(host, 1)) == (11, 2)
    held = host.partition("stock", 0)
    assert held is not None and held.applied_offset() == 11


def test_changelog_records_say_which_source_topic_they_were_folded_from(
    broker: KafkaCluster, host: StoreHost, tmp_path: Path
) -> None:
    # Partition 0's state is stamped as built from a source topic of id "src-id"; partition 1
    # has no id (an earlier foldstream, a broker without ids): its records carry none.
    host.close([("stock", 0)])
    stamped = RocksDBWriter(partition_path(tmp_path, "stock", 0), identity="t/0")
    stamped.stamp_topic_ids("src-id", None)
    stamped.close()
    host.open("stock", 0, identity="t/0", epoch=1)
    changelog = run_task(broker, host, [events(p, range(0, 3)) for p in (0, 1)])
    marks = {
        p: dict(headers).get(SOURCE_ID_HEADER)
        for p, _, _, _, headers in read_topic(broker.bootstrap, changelog, PARTITIONS)
    }
    assert marks == {0: b"src-id", 1: None}


def test_a_task_reports_the_time_of_each_step_to_the_store_host(
    broker: KafkaCluster, host: StoreHost, reports: list[tuple[str, dict[str, float], int]]
) -> None:
    run_task(broker, host, [events(p, range(0, 5)) for p in range(PARTITIONS)])
    [(store, steps, records)] = reports
    assert (store, records) == ("stock", 5 * PARTITIONS)
    assert list(steps) == list(STEPS)
    # Every step was timed: each took some time (the changelog's acknowledgements a broker
    # round trip, reading and committing a round trip to the host).
    assert all(seconds > 0 for seconds in steps.values()), steps


def test_a_task_of_a_shared_query_folds_each_store_from_its_own_offset(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    reports: list[tuple[str, dict[str, float], int]] = []
    host = StoreHost(
        state_dir=tmp_path,
        on_task=lambda store, steps, records: reports.append((store, steps, records)),
        formats={"sales_10m": ORDERED_FORMAT},
    )
    host.start()
    try:
        for store in ("stock", "sales_10m"):
            host.open(store, 0, identity="t/0", epoch=1)
        # stock alone folds the first 4 events (a store that was ahead, e.g. restored).
        fetch = events(0, range(0, 8))
        run_task(broker, host, [{0: fetch[0][:4]}])
        assert on_hand(host, 0) == 3
        reports.clear()

        changelogs = [f"shared-{uuid.uuid4().hex[:8]}.{s}.changelog" for s in ("a", "b")]
        ensure_topics(
            broker.bootstrap, [TopicSpec(t, PARTITIONS, compact=True) for t in changelogs]
        )
        options = fold_options(broker, host) | {
            "stores": stores_option(
                [
                    {"store": "stock", "changelog_topic": changelogs[0]},
                    {"store": "sales_10m", "changelog_topic": changelogs[1]},
                ]
            )
        }
        # Both stores in one task: stock skips what it applied, sales_10m folds every event.
        assert fold_task.fold_task(options, iter([fetch]), dict) == {0: (8, 7)}
        assert on_hand(host, 0) == 7  # no event counted twice
        for store in ("stock", "sales_10m"):
            held = host.partition(store, 0)
            assert held is not None and held.applied_offset() == 7
        assert [(store, records) for store, _, records in reports] == [
            ("stock", 8),
            ("sales_10m", 8),
        ]
        # Each store's changes went to its own changelog: stock's one key once.
        assert len(read_topic(broker.bootstrap, changelogs[0], PARTITIONS)) == 1
    finally:
        host.stop()


def test_the_reader_folds_what_it_fetches_or_was_planned_with_and_yields_a_row_per_partition(
    broker: KafkaCluster, host: StoreHost, tmp_path: Path
) -> None:
    topic = f"fold-{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, PARTITIONS)])
    producer = Producer(producer_config(broker.bootstrap))
    for partition, count in ((0, 6), (1, 3)):
        for _, record in events(partition, range(count))[partition]:
            producer.produce(
                topic, key=record.key, value=record.value, headers=list(record.headers),
                partition=partition,
            )  # fmt: skip
    assert producer.flush(30) == 0
    reader = FoldStreamReader(
        fold_options(broker, host)
        | {"topic": topic, "partitions": "0,1,2", "owned": str(tmp_path / "owned.json")}
    )
    fetched = KafkaRanges((KafkaRange(0, 0, 4), KafkaRange(1, 0, 3)))
    assert list(reader.read(fetched)) == [(0, 4, 3), (1, 3, 2)]
    assert (on_hand(host, 0), on_hand(host, 1)) == (3, 2)
    assert list(reader.read(fetched)) == []  # a replayed task applies nothing twice

    # A micro-batch planned with its records (read by the driver's tail) fetches nothing.
    (rest,) = read_messages(broker.bootstrap, topic, [KafkaRange(0, 4, 6)])
    tail = tuple(
        TailRecord(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in rest
    )
    planned = KafkaRanges((KafkaRange(0, 4, 6),), planned=((0, tail),))
    assert list(reader.read(planned)) == [(0, 2, 5)]
    assert on_hand(host, 0) == 5
