from __future__ import annotations

import socket
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from foldstream.broker import KafkaCluster, free_port
from foldstream.errors import ConfigurationError
from foldstream.kafka import (
    TopicSpec,
    ensure_topics,
    partition_for,
    producer_config,
    read_partitions_to_end,
)
from foldstream.kafka_client import admin_client
from foldstream.offsets import EndOffsets


def test_producer_partitions_like_the_router(broker: KafkaCluster) -> None:
    ensure_topics(broker.bootstrap, [TopicSpec("router.check", 6)])
    producer = Producer(producer_config(broker.bootstrap))
    delivered: list[tuple[bytes, int]] = []
    keys = [f"key-{n}".encode() for n in range(300)]
    for key in keys:
        producer.produce(
            "router.check",
            key=key,
            value=b"v",
            on_delivery=lambda err, msg: delivered.append((msg.key(), msg.partition())),
        )
    assert producer.flush(30) == 0
    assert len(delivered) == len(keys)
    assert all(partition == partition_for(key, 6) for key, partition in delivered)
    assert len({p for _, p in delivered}) == 6


def test_topics_are_provisioned_idempotently(broker: KafkaCluster) -> None:
    specs = [TopicSpec("prov.events", 3), TopicSpec("prov.store.changelog", 3, compact=True)]
    ensure_topics(broker.bootstrap, specs)
    ensure_topics(broker.bootstrap, specs)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "prov.store.changelog")
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["cleanup.policy"].value == "compact"
    with pytest.raises(ConfigurationError, match="has 3 partitions"):
        ensure_topics(broker.bootstrap, [TopicSpec("prov.events", 4)])


def test_end_offsets_include_the_whole_last_batch(broker: KafkaCluster) -> None:
    """The tail's end is past a multi-record batch's last record, and follows new ones."""
    ensure_topics(broker.bootstrap, [TopicSpec("ends.check", 1)])
    producer = Producer(producer_config(broker.bootstrap, linger_ms=50))
    for n in range(10):
        producer.produce("ends.check", key=b"k", value=str(n).encode(), partition=0)
    assert producer.flush(30) == 0
    ends = EndOffsets(broker.bootstrap, "ends.check", [0])
    try:
        assert ends.ends() == {0: 10}
        for _ in range(5):
            producer.produce("ends.check", key=b"k", value=b"more", partition=0)
        producer.flush(30)
        assert ends.wait_beyond({0: 14}, timeout=10) == {0: 15}
    finally:
        ends.close()


def test_free_ports_lie_below_the_ephemeral_range() -> None:
    """A port handed to a process that binds it later is never one the kernel gives to a
    socket bound to port 0 meanwhile (the JVM an instance starts first binds several)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports), ports
    assert len(ports) > 1
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free, as promised


def test_a_read_from_0_starts_at_the_first_offset_left(broker: KafkaCluster) -> None:
    """Records deleted (retention, DeleteRecords) before a partition read from 0 are no error,
    even while another partition is read from a position (which must lie within its log)."""
    ensure_topics(broker.bootstrap, [TopicSpec("read.deleted", 2)])
    producer = Producer(producer_config(broker.bootstrap))
    for n in range(5):
        for partition in (0, 1):
            producer.produce("read.deleted", value=b"%d" % n, partition=partition)
    assert producer.flush(30) == 0
    admin = admin_client(broker.bootstrap)  # kept: it serves the futures
    deleted = admin.delete_records([TopicPartition("read.deleted", 0, 3)])
    for future in deleted.values():
        future.result(timeout=30)
    read = read_partitions_to_end(broker.bootstrap, "read.deleted", {0: 0, 1: 2})
    assert sorted((m.partition(), m.offset()) for batch in read for m in batch) == [
        (0, 3),
        (0, 4),
        (1, 2),
        (1, 3),
        (1, 4),
    ]
