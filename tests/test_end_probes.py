"""Ends learnt when asked (:class:`~foldstream.end_probes.ProbedEnds`): where a reader of committed
records stops (below an open transaction, past an aborted one), current at every probe, and the
last ones when a probe cannot finish."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from foldstream.broker import KafkaCluster, free_port
from foldstream.end_probes import ProbedEnds
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import TopicSpec, consumer_config, ensure_topics, producer_config


def _produce(producer: Producer, topic: str, partition: int, count: int) -> None:
    for n in range(count):
        producer.produce(topic, key=b"k", value=str(n).encode(), partition=partition)
    assert producer.flush(30) == 0


def _reader_stops_at(bootstrap: str, topic: str) -> int:
    """Where a consumer reading partition 0 from its start reports the partition's end."""
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF
                return int(message.offset())
        raise AssertionError(f"{topic} never reached its end")
    finally:
        consumer.close()


def test_every_probe_answers_the_end_now(broker: KafkaCluster) -> None:
    ensure_topics(broker.bootstrap, [TopicSpec("probed.batch", 1)])
    producer = Producer(producer_config(broker.bootstrap, linger_ms=50))
    _produce(producer, "probed.batch", 0, 10)
    ends = ProbedEnds(broker.bootstrap, "probed.batch", [0])
    try:
        assert ends.ends() == {0: 10}
        assert ends.ends() == {0: 10}  # probed again, nothing new
        _produce(producer, "probed.batch", 0, 5)
        assert ends.ends() == {0: 15}
    finally:
        ends.close()


def test_every_partition_has_its_end_empty_or_of_many_batches(broker: KafkaCluster) -> None:
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


def test_without_a_probe_the_last_ends_are_given(broker: KafkaCluster) -> None:
    ensure_topics(broker.bootstrap, [TopicSpec("probed.last", 1)])
    producer = Producer(producer_config(broker.bootstrap, linger_ms=5))
    _produce(producer, "probed.last", 0, 3)
    ends = ProbedEnds(broker.bootstrap, "probed.last", [0])
    try:
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


def test_an_open_transaction_ends_where_a_reader_can_read(broker: KafkaCluster) -> None:
    """Reading committed records only, a reader stops at the last stable offset, below an open
    transaction: the probed end is there, not at the high watermark past it (the lag of a copy
    that folded everything committed is 0). Once a new writer of its transactional id fenced
    the writer and aborted the transaction, the end is past its records and marker."""
    ensure_topics(broker.bootstrap, [TopicSpec("probed.open", 1)])
    plain = Producer(producer_config(broker.bootstrap, linger_ms=5))
    _produce(plain, "probed.open", 0, 4)
    transactional_id = f"probed-{uuid.uuid4().hex}"
    writer = Producer(producer_config(broker.bootstrap, **{"transactional.id": transactional_id}))
    writer.init_transactions(30)
    writer.begin_transaction()
    for n in range(3):
        writer.produce("probed.open", key=b"open", value=b"%d" % n, partition=0)
    assert writer.flush(30) == 0  # sent, not committed: offsets 4-6
    _produce(plain, "probed.open", 0, 2)  # 7-8, behind the open transaction
    ends = ProbedEnds(broker.bootstrap, "probed.open", [0])
    try:
        assert ends.ends() == {0: 4} == {0: _reader_stops_at(broker.bootstrap, "probed.open")}
        Producer(
            producer_config(broker.bootstrap, **{"transactional.id": transactional_id})
        ).init_transactions(30)  # fences the writer, aborting its transaction (marker: 9)
        assert ends.ends() == {0: 10} == {0: _reader_stops_at(broker.bootstrap, "probed.open")}
    finally:
        ends.close()


def test_a_probe_slower_than_its_caller_still_lands(broker: KafkaCluster) -> None:
    """The lag meter waits 0.05 s for its probes: one that takes longer (a loaded machine, a
    far cluster) gives its ends to the next caller instead of being thrown away."""
    ensure_topics(broker.bootstrap, [TopicSpec("probed.slow", 1)])
    _produce(Producer(producer_config(broker.bootstrap, linger_ms=5)), "probed.slow", 0, 3)
    ends = ProbedEnds(broker.bootstrap, "probed.slow", [0])
    try:
        with pytest.raises(BrokerUnavailable, match="probed.slow partitions \\[0\\]"):
            ends.ends(timeout=0.001)  # the new consumer has not even connected yet
        deadline = time.monotonic() + 20
        while True:
            try:
                assert ends.ends(timeout=0) == {0: 3}
                break
            except BrokerUnavailable:
                assert time.monotonic() < deadline, "the probe never landed"
                time.sleep(0.02)
    finally:
        ends.close()
