"""Reading a whole topic back, for comparing stores with what Kafka holds."""

from __future__ import annotations

from foldstream.kafka import read_to_end


def read_topic(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, int, bytes, bytes | None, list[tuple[str, bytes]]]]:
    """Every record of ``topic`` as (partition, offset, key, value, headers), to the end."""
    return [
        (m.partition(), m.offset(), m.key(), m.value(), list(m.headers() or ()))
        for batch in read_to_end(bootstrap, topic, partitions)
        for m in batch
    ]
