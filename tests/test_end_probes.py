"""Ends learnt when asked (:class:`~foldstream.end_probes.ProbedEnds`): right where the broker
under-reports them, current at every probe, and the last ones when a probe cannot finish."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from foldstream.broker import EmbeddedBroker, free_port
from foldstream.end_probes import ProbedEnds
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import TopicSpec, ensure_topics, producer_config


def _produce(producer: Producer, topic: str, partition: int, count: int) -> None:
    for n in range(count):
        producer.produce(topic, key=b"k", value=str(n).encode(), partition=partition)
    assert producer.flush(30) == 0


def test_a_probe_reads_past_the_reported_end_of_a_batch(broker: EmbeddedBroker) -> None:
    """Tansu reports the end of a 10-record batch as its base offset + 1."""
    ensure_topics(broker.bootstrap, [TopicSpec("probed.batch", 1)])
    producer = Producer(producer_config(broker.bootstrap, linger_ms=50))
    _produce(producer, "probed.batch", 0, 10)
    ends = ProbedEnds(broker.bootstrap, "probed.batch", [0])
    try:
        assert ends.ends() == {0: 10}
        _produce(producer, "probed.batch", 0, 5)
        assert ends.ends() == {0: 15}  # every probe reads the end now
    finally:
        ends.close()


def test_every_partition_has_its_end_empty_or_of_many_batches(broker: EmbeddedBroker) -> None:
    ensure_topics(broker.bootstrap, [TopicSpec("probed.many", 3)])
    producer = Producer(producer_config(broker.bootstrap, linger_ms=5))
    for _ in range(40):
        _produce(producer, "probed.many", 1, 7)
    _produce(producer, "probed.many", 2, 1)
    ends = ProbedEnds(broker.bootstrap, "probed.many", [0, 1, 2])
    try:
        assert ends.ends() == {0: 0, 1: 280, 2: 1}
    finally:
        ends.close()


def test_without_a_probe_the_last_ends_are_given(broker: EmbeddedBroker) -> None:
    ensure_topics(broker.bootstrap, [TopicSpec("probed.last", 1)])
    producer = Producer(producer_config(broker.bootstrap, linger_ms=5))
    _produce(producer, "probed.last", 0, 3)
    ends = ProbedEnds(broker.bootstrap, "probed.last", [0])
    try:
        with pytest.raises(BrokerUnavailable, match="probed.last partitions \\[0\\]"):
            ends.ends(timeout=0)  # never probed
        assert ends.ends() == {0: 3}
        _produce(producer, "probed.last", 0, 2)
        assert ends.ends(timeout=0) == {0: 3}
        assert ends.ends() == {0: 5}
    finally:
        ends.close()


def test_an_unreachable_cluster_is_an_error_within_the_timeout() -> None:
    ends = ProbedEnds(f"127.0.0.1:{free_port()}", "probed.nowhere", [0])
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="check that the Kafka cluster is reachable"):
            ends.ends(timeout=1.0)
        assert time.monotonic() - started < 5
    finally:
        ends.close()
