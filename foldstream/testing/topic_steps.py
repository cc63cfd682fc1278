"""Sentences about topics other producers write: a topic's partitions, records written by a
librdkafka or a Java-compatible producer, and the partition each landed in
(:mod:`foldstream.testing.steps` lists the sentences)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from pytest_bdd import given, parsers, then, when

from foldstream.broker import KafkaCluster
from foldstream.kafka import Partitioner, TopicSpec, ensure_topics, partition_for, topic_partitions
from foldstream.kafka_client import admin_client, client_config
from foldstream.testing.kafka import kafka_python_config
from foldstream.testing.scenario import ScenarioState, _rows
from foldstream.times import to_epoch_ms


@given(parsers.parse('the topic "{topic}" has {partitions:d} partitions'))
def the_topic_exists(broker: KafkaCluster, topic: str, partitions: int) -> None:
    ensure_topics(broker.bootstrap, [TopicSpec(topic, partitions)])


@when(parsers.parse('a "{client}" producer writes these records to "{topic}":'))
def produce_records(
    broker: KafkaCluster,
    scenario_state: ScenarioState,
    client: str,
    topic: str,
    datatable: list[list[str]],
) -> None:
    """``client`` is ``librdkafka`` (its defaults) or ``java`` (a Java-compatible client,
    kafka-python); an empty ``value`` cell writes a tombstone. A ``timestamp`` column (ISO-8601
    or epoch milliseconds) sets the records' timestamps (else: the producer's clock)."""
    records = [
        (
            r["key"].encode(),
            r["value"].encode() or None,
            to_epoch_ms(r["timestamp"]) if r.get("timestamp") else None,
        )
        for r in _rows(datatable)
    ]
    scenario_state.produced_to = topic
    if client == "librdkafka":
        producer = Producer(client_config(broker.bootstrap))  # librdkafka's defaults

        def delivered(error: Any, message: Any) -> None:
            scenario_state.produced.append((message.key(), message.partition()))

        for key, value, stamp in records:
            producer.produce(
                topic, key=key, value=value, on_delivery=delivered, timestamp=stamp or 0
            )
        assert producer.flush(30) == 0
    elif client == "java":
        try:
            import kafka
        except ImportError:
            pytest.fail("a 'java' producer needs kafka-python: pip install kafka-python")
        java = kafka.KafkaProducer(**kafka_python_config(broker.bootstrap))
        futures = [
            (key, java.send(topic, key=key, value=value, timestamp_ms=stamp))
            for key, value, stamp in records
        ]
        java.flush()
        scenario_state.produced += [(k, f.get(timeout=10).partition) for k, f in futures]
        java.close()
    else:
        pytest.fail(f"unknown producer {client!r}: use 'librdkafka' or 'java'")
    assert len(scenario_state.produced) == len(records)


@then(
    parsers.parse(
        'every record landed in the partition the "{partitioner}" partitioner gives its key'
    )
)
def landed_by_partitioner(
    broker: KafkaCluster, scenario_state: ScenarioState, partitioner: Partitioner
) -> None:
    assert scenario_state.produced, "no records were produced in this scenario"
    partitions = topic_partitions(admin_client(broker.bootstrap), scenario_state.produced_to)
    assert partitions, f"topic {scenario_state.produced_to!r} does not exist"
    wrong = [
        (key, partition)
        for key, partition in scenario_state.produced
        if partition != partition_for(key, partitions, partitioner)
    ]
    assert not wrong, f"{partitioner} puts these keys elsewhere: {wrong}"
