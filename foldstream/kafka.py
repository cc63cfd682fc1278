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

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
    murmur2,
)
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

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

    Committed records only: the end is the last stable offset the partitions' leaders answer
    when the read starts (:func:`listed_ends`; a transaction still open there ends the read
    before its records; an aborted one's records are never given). A start of 0 is the
    partition's first offset (records before it deleted by retention or ``DeleteRecords``);
    any other start past a partition's end is an error, never a silent jump back to its first
    record.
    """
    config = consumer_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms)
    if prefetch_kbytes is not None:
        config["queued.max.messages.kbytes"] = prefetch_kbytes
    if any(starts.values()):
        config["auto.offset.reset"] = "error"
    consumer = Consumer(config)
    try:
        ends = listed_ends(consumer, topic, starts, timeout)
        past = {p: (o, ends[p]) for p, o in starts.items() if o > ends[p]}
        if past:
            raise BrokerUnavailable(
                f"reading {topic}: starts past the partitions' ends ({{partition: (start, end)}}: "
                f"{past}): the topic was created again since?"
            )
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING if o == 0 else o) for p, o in starts.items()]
        )
        reached = dict(starts)
        while any(reached[p] < ends[p] for p in starts):
            messages = consume_available(consumer, 10_000, timeout)
            if not messages:
                raise BrokerUnavailable(
                    f"no answer for {timeout}s while reading {topic} from {dict(starts)} to "
                    f"{ends} (at {reached}): check that the Kafka cluster is reachable"
                )
            batch = []
            for message in messages:
                error = message.error()
                if error is None:
                    reached[message.partition()] = message.offset() + 1
                    batch.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    partition = message.partition()
                    reached[partition] = max(reached[partition], message.offset())
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


def listed_ends(
    consumer: Any, topic: str, partitions: Iterable[int], timeout: float
) -> dict[int, int]:
    """``{partition: end}`` as the partitions' leaders answer ListOffsets (the last stable
    offset for a ``read_committed`` consumer): asked until every partition answers, as a newly
    elected leader answers OFFSET_NOT_AVAILABLE until its high watermark caught up (KIP-207).

    Reading to the first end-of-partition instead could stop short there: a new leader's high
    watermark trails the records its predecessor acknowledged until its followers fetch again,
    and a replay that stopped short would decide commands on stale aggregates."""
    wanted = [TopicPartition(topic, p, OFFSET_END) for p in partitions]

    def ask() -> dict[int, int]:
        answered = consumer.offsets_for_times(wanted, timeout=min(timeout, 5.0))
        failed = [tp for tp in answered if tp.error is not None or tp.offset < 0]
        if failed:
            raise BrokerUnavailable(
                f"the ends of {topic}: {[(tp.partition, tp.error) for tp in failed]}"
            )
        return {tp.partition: tp.offset for tp in answered}

    try:
        return Retrying(  # type: ignore[no-any-return]
            stop=stop_after_delay(timeout),
            wait=wait_fixed(0.1),
            retry=retry_if_exception_type((BrokerUnavailable, KafkaException)),
            reraise=True,
        )(ask)
    except KafkaException as exc:
        raise BrokerUnavailable(f"asking the ends of {topic}: {exc}") from exc


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


#: A consumer's ``isolation.level``. ``read_committed`` hides the records of aborted
#: transactions (a fenced command writer's) and stops at the last stable offset, before an open
#: transaction; docs/decisions.md, "Isolation levels", says which reader uses which and why.
Isolation = Literal["read_committed", "read_uncommitted"]


def consumer_config(
    bootstrap: str,
    *,
    fetch_wait_max_ms: int = 10,
    isolation: Isolation = "read_committed",
    **extra: object,
) -> dict[str, object]:
    """A consumer without a group: callers assign partitions and track offsets themselves.
    It reads committed records only unless ``isolation`` says otherwise: set here rather than
    left to librdkafka's default, and a client configuration may not change it. With this
    process's client properties, as :func:`producer_config`."""
    return client_config(
        bootstrap,
        **{
            "group.id": UNUSED_GROUP_ID,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": fetch_wait_max_ms,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            **extra,
        },
    )


def tail_config(bootstrap: str, *, fetch_wait_max_ms: int = 10) -> dict[str, object]:
    """A consumer tailing partitions at their ends (a projection's planner,
    :class:`~foldstream.offsets.EndOffsets`): fetches of at most 64 KB a partition, and a
    bounded prefetch (:data:`BOUNDED_PREFETCH_KBYTES`)."""
    config = consumer_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms)
    config["fetch.message.max.bytes"] = 65536
    config["queued.max.messages.kbytes"] = BOUNDED_PREFETCH_KBYTES
    return config
