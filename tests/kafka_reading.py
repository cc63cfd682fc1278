"""Reading a whole topic back, for comparing stores with what Kafka holds."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, TopicPartition

from foldstream.kafka import consume_available, consumer_config


def read_topic(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, int, bytes, bytes | None, list]]:
    """Every record of ``topic`` as (partition, offset, key, value, headers), to the end."""
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records = []
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            messages = consume_available(consumer, 10_000, 10.0)
            assert messages, f"no answer while reading {topic}"
            for message in messages:
                if message.error() is not None:
                    assert message.error().code() == KafkaError._PARTITION_EOF
                    at_end.add(message.partition())
                    continue
                at_end.discard(message.partition())
                records.append(
                    (
                        message.partition(),
                        message.offset(),
                        message.key(),
                        message.value(),
                        list(message.headers() or ()),
                    )
                )
    finally:
        consumer.close()
    return records
