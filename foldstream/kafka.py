"""Kafka client configuration, reading topics to their end and the key → partition function.

Producers and routers must agree on where a key lives, so both go through :func:`partition_for`,
which is exactly what the producer's configured partitioner computes. Creating and checking
topics is :mod:`foldstream.kafka_topics` (its names are re-exported here).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from itertools import repeat
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition, murmur2

from foldstream.errors import BrokerUnavailable, ConfigurationError
from foldstream.kafka_client import client_config
from foldstream.kafka_topics import TopicSpec as TopicSpec  # re-exported
from foldstream.kafka_topics import ensure_topics as ensure_topics  # re-exported
from foldstream.kafka_topics import topic_ids as topic_ids  # re-exported
from foldstream.kafka_topics import topic_partitions as topic_partitions  # re-exported

Partitioner = Literal["murmur2", "consistent"]
#: The group id of every consumer: librdkafka's consumers need one (and look up its
#: coordinator) even though foldstream assigns partitions itself and commits no offsets.
UNUSED_GROUP_ID = "foldstream-unused"
PARTITIONERS: tuple[Partitioner, ...] = ("murmur2", "consistent")


def partition_for(key: bytes, partitions: int, partitioner: Partitioner = "murmur2") -> int:
    """The partition a producer with ``partitioner`` writes ``key`` to.

    ``murmur2`` is the Java clients' default (and what foldstream's producers use);
    ``consistent`` is librdkafka's default (CRC32), declared for topics written by such producers.
    """
    if partitioner == "murmur2":
        return int(murmur2(key, partitions))
    if partitioner == "consistent":
        return zlib.crc32(key) % partitions
    raise _unknown(partitioner)


def partitions_for(
    keys: Iterable[bytes], partitions: int, partitioner: Partitioner = "murmur2"
) -> list[int]:
    """:func:`partition_for` of each of ``keys``, without a Python call per key."""
    if partitioner == "murmur2":
        # map() calls murmur2 from C: no bytecode per key (murmur2 returns an int).
        return list(map(murmur2, keys, repeat(partitions)))
    if partitioner == "consistent":
        crc32 = zlib.crc32
        return [crc32(key) % partitions for key in keys]
    raise _unknown(partitioner)


def _unknown(partitioner: str) -> ConfigurationError:
    return ConfigurationError(f"unknown partitioner {partitioner!r}; use one of {PARTITIONERS}")


#: How a transactional producer learns that another one took its ``transactional.id``:
#: librdkafka says ``_FENCED``; the broker's own codes show up in delivery reports.
FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind ``exc``: the client sometimes wraps it in a SystemError."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KafkaException) and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


def is_fenced(exc: BaseException) -> bool:
    """Whether ``exc`` says another producer took this one's ``transactional.id``."""
    error = kafka_error_of(exc)
    return error is not None and error.code() in FENCED_CODES


def consume_available(consumer: Any, max_messages: int, timeout: float) -> list[Any]:
    """Wait up to ``timeout`` for the first message, then take what is already there.

    ``consume(n, timeout)`` alone waits for n messages or the whole timeout: slow when idle.
    """
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, 0)]


def produce_when_room(producer: Any, topic: str, *, wait_s: float = 0.05, **record: Any) -> None:
    """``producer.produce(topic, **record)``; while the producer's local queue is full, serve
    delivery reports for ``wait_s`` (which frees room) and try again."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(wait_s)


def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: int | Iterable[int],
    *,
    fetch_wait_max_ms: int = 10,
    timeout: float = 30.0,
) -> Iterator[list[Any]]:
    """Every record of ``topic`` from offset 0 to the end of each partition, in poll batches.

    ``partitions`` is the topic's partition count (read them all) or the partitions to read.
    """
    wanted = range(partitions) if isinstance(partitions, int) else sorted(set(partitions))
    return read_partitions_to_end(
        bootstrap,
        topic,
        dict.fromkeys(wanted, 0),
        fetch_wait_max_ms=fetch_wait_max_ms,
        timeout=timeout,
    )


def read_partitions_to_end(
    bootstrap: str,
    topic: str,
    starts: Mapping[int, int],
    *,
    fetch_wait_max_ms: int = 10,
    timeout: float = 30.0,
    prefetch_kbytes: int | None = None,
) -> Iterator[list[Any]]:
    """The records of ``topic`` from ``starts`` (``{partition: offset}``) to each partition's
    end, in poll batches; ``prefetch_kbytes`` bounds what the consumer fetches ahead of them
    (None: librdkafka's default, 64 MB).

    The end is where each partition reports end-of-partition after its last record, which is
    right even on brokers that under-report log end offsets. Reading every partition from 0
    starts at the first offset each holds; otherwise a start past a partition's end is an
    error, never a silent jump back to its first record (Kafka answers OFFSET_OUT_OF_RANGE; a
    broker that answers nothing at all, such as Tansu, is reported after ``timeout``).
    """
    config = consumer_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms)
    if prefetch_kbytes is not None:
        config["queued.max.messages.kbytes"] = prefetch_kbytes
    if any(starts.values()):
        config["auto.offset.reset"] = "error"
    consumer = Consumer(config)
    # Offset 0 rather than OFFSET_BEGINNING: Tansu took a long time to resolve that on every read.
    consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
    at_end: set[int] = set()
    try:
        while len(at_end) < len(starts):
            messages = consume_available(consumer, 10_000, timeout)
            if not messages:
                raise BrokerUnavailable(
                    f"no answer for {timeout}s while reading {topic} from {dict(starts)} (a "
                    "start past the end, e.g. of a topic created again, gets none either)"
                )
            batch = []
            for message in messages:
                error = message.error()
                if error is None:
                    at_end.discard(message.partition())
                    batch.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                elif error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise BrokerUnavailable(
                        f"reading {topic} from {dict(starts)}: a start lies outside its "
                        f"partition (the topic was created again since?): {error}"
                    )
                else:
                    raise BrokerUnavailable(f"reading {topic}: {error}")
            if batch:
                yield batch
    finally:
        consumer.close()


def producer_config(bootstrap: str, *, linger_ms: int = 5, **extra: object) -> dict[str, object]:
    """An idempotent producer that partitions keys like the Java clients (murmur2), with this
    process's client properties (security: :mod:`~foldstream.kafka_client`)."""
    return client_config(
        bootstrap,
        **{
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": linger_ms,
            **extra,
        },
    )


#: What a consumer that handles records slower than it could fetch them buffers ahead, at most
#: (``queued.max.messages.kbytes``): a few fetches keep it busy, and librdkafka's default, 64 MB,
#: would sit in the process's memory (docs/decisions.md, "Memory").
BOUNDED_PREFETCH_KBYTES = 4096


def consumer_config(
    bootstrap: str, *, fetch_wait_max_ms: int = 10, **extra: object
) -> dict[str, object]:
    """A consumer without a group: callers assign partitions and track offsets themselves.
    With this process's client properties, as :func:`producer_config`."""
    return client_config(
        bootstrap,
        **{
            "group.id": UNUSED_GROUP_ID,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": fetch_wait_max_ms,
            "enable.partition.eof": True,
            **extra,
        },
    )


def end_reader_config(bootstrap: str, *, fetch_wait_max_ms: int = 10) -> dict[str, object]:
    """A consumer reading at partitions' ends (a tail, a probe): fetches of at most 64 KB a
    partition, and a bounded prefetch (:data:`BOUNDED_PREFETCH_KBYTES`)."""
    return consumer_config(
        bootstrap,
        fetch_wait_max_ms=fetch_wait_max_ms,
        **{
            "fetch.message.max.bytes": 65536,
            "queued.max.messages.kbytes": BOUNDED_PREFETCH_KBYTES,
        },
    )
