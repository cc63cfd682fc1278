"""The records a projection task reads (:func:`~foldstream.projections.source.read_messages`, a
rebuild's reader) across the kill -9 of its partitions' leader: every committed record once, in
offset order, no aborted one, whatever the leader's successor answers first."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from foldstream.broker import KafkaCluster
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from foldstream.projections.source import KafkaRange, read_messages

TOPIC = "killed.events"
PARTITIONS = 2
TRANSACTIONS = 100  # of 5 records each (10 MB, past the prefetch); every 7th aborted
#: Records larger than the reader prefetches (4 MB): most are fetched after the kill.
VALUE = b"x" * 20_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    running = KafkaCluster(
        brokers=3,
        data_dir=tmp_path_factory.mktemp("killed") / "kafka",
        properties={
            "min.insync.replicas": "2",
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "500",
        },
    )
    try:
        yield running.start()
    finally:
        running.stop()


def _write(bootstrap: str) -> dict[int, list[int]]:
    """Transactions on every partition, some aborted; the committed records' offsets."""
    config = producer_config(bootstrap)
    config["transactional.id"] = f"killed-{uuid.uuid4().hex}"
    producer = Producer(config)
    producer.init_transactions(30)
    committed: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for n in range(TRANSACTIONS):
        landed: list[int] = []
        producer.begin_transaction()
        for _ in range(5):
            producer.produce(
                TOPIC,
                key=f"k{n}".encode(),
                value=VALUE,
                partition=n % PARTITIONS,
                on_delivery=_noting(landed),
            )
        producer.flush(30)
        if n % 7 == 3:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed[n % PARTITIONS] += landed
    return committed


def _noting(offsets: list[int]) -> Callable[[Any, Any], None]:
    """A delivery callback appending each record's offset to ``offsets``."""

    def noted(_: Any, message: Any) -> None:
        offsets.append(message.offset())

    return noted


def _leader(bootstrap: str, partition: int) -> int:
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=10).topics
    return int(topics[TOPIC].partitions[partition].leader)


def test_a_task_reads_every_committed_record_once_across_a_leader_kill(
    cluster: KafkaCluster,
) -> None:
    ensure_topics(
        cluster.bootstrap,
        [TopicSpec(TOPIC, PARTITIONS)],
        replication_factor=3,
        min_insync_replicas=2,
    )
    committed = _write(cluster.bootstrap)
    ends = {p: offsets[-1] + 2 for p, offsets in committed.items()}  # past the last marker
    spans = [KafkaRange(p, 0, end) for p, end in ends.items()]
    read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    killed = None
    for batch in read_messages(cluster.bootstrap, TOPIC, spans, max_messages=25):
        for message in batch:
            read[message.partition()].append(message.offset())
        if killed is None:
            killed = _leader(cluster.bootstrap, 0)
            cluster.node(killed).kill()
        time.sleep(0.2)  # the reader goes on while the leader's successor takes over
    assert killed is not None
    for partition, offsets in read.items():
        assert offsets == committed[partition], (
            f"partition {partition}: read {len(offsets)} records "
            f"({len(offsets) - len(set(offsets))} twice), committed {len(committed[partition])}"
        )
