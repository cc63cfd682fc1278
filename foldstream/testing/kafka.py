"""Kafka helpers for tests: where logs end, records at given offsets, a second writer, and
topics deleted and created again.

Events appended here go straight to the events topic, as another producer's would: projections
fold them, but a running command handler only knows the events it replayed at start and those
of its own commands, so use ids that commands of the same scenario do not touch.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from foldstream.domain import Aggregate, EventCodec, EventRecord
from foldstream.end_probes import ProbedEnds
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import (
    Isolation,
    TopicSpec,
    consume_available,
    consumer_config,
    ensure_topics,
    listed_ends,
    produce_when_room,
    producer_config,
    read_to_end,
    topic_partitions,
)
from foldstream.kafka_client import admin_client, installed

#: kafka-python's names of the librdkafka client properties it has.
_KAFKA_PYTHON_NAMES = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "client.id": "client_id",
}


def kafka_python_config(bootstrap: str) -> dict[str, Any]:
    """kafka-python's configuration for ``bootstrap`` with this process's client properties
    (those kafka-python has: security protocol, SASL PLAIN/SCRAM, TLS files, client id)."""
    config: dict[str, Any] = {"bootstrap_servers": bootstrap}
    for name, value in installed().items():
        if name in _KAFKA_PYTHON_NAMES:
            config[_KAFKA_PYTHON_NAMES[name]] = value
    return config


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """``{partition: end offset}`` of ``topic`` now: where a reader of committed records stops
    (the last stable offset, :class:`~foldstream.end_probes.ProbedEnds`)."""
    ends = ProbedEnds(bootstrap, topic, list(range(partitions)))
    try:
        return ends.ends()
    finally:
        ends.close()


def records_at(
    bootstrap: str, topic: str, partition: int, first: int, last: int, timeout: float = 30.0
) -> list[EventRecord]:
    """The records of one partition from offset ``first`` to ``last``, both included."""
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, partition, first)])
    found: list[EventRecord] = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < last - first + 1:
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"{topic}[{partition}] offsets {first}..{last}: only {len(found)} read"
                )
            for message in consume_available(consumer, 1000, 0.5):
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise BrokerUnavailable(f"reading {topic}: {error}")
                if error is None and first <= message.offset() <= last:
                    found.append(EventRecord.from_message(message))
        return found
    finally:
        consumer.close()


def append_events(producer: Producer, topic: str, events: Iterable[Any]) -> None:
    """Produce domain events as foldstream's command side would (flush to wait for them)."""
    codec = EventCodec()
    for domain_event in events:
        record = codec.encode(domain_event)
        produce_when_room(
            producer, topic, key=record.key, value=record.value, headers=list(record.headers)
        )
    producer.poll(0)


class CommandWriter:
    """Another writer: runs ``command`` on local aggregates round after round, in a thread, and
    appends their events to ``topic`` at a steady pace (one round every ``pause`` seconds)
    until :meth:`stop_after` says how many more rounds to write (``max_rounds`` at most). A
    round takes every aggregate, or ``per_round`` of them drawn at random (seeded).
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        aggregates: list[Aggregate],
        command: str,
        arguments: dict[str, Any],
        max_rounds: int = 5000,
        pause: float = 0.02,
        per_round: int | None = None,
    ) -> None:
        self.topic = topic
        self.aggregates = aggregates
        self.per_round = per_round
        self._random = random.Random(len(aggregates))
        self.command = command
        self.arguments = arguments
        self.rounds = 0
        self.last_round = max_rounds
        self.pause = pause
        self.error: BaseException | None = None
        self._producer = Producer(producer_config(bootstrap))
        self._thread = threading.Thread(target=self._run, name="command-writer", daemon=True)

    def _run(self) -> None:
        try:
            while self.rounds < self.last_round:
                chosen = (
                    self.aggregates
                    if self.per_round is None
                    else self._random.sample(self.aggregates, self.per_round)
                )
                for aggregate in chosen:
                    getattr(aggregate, self.command)(**self.arguments)
                    append_events(self._producer, self.topic, aggregate.collect_events())
                self.rounds += 1
                time.sleep(self.pause)
            unsent = self._producer.flush(30)
            if unsent:
                raise BrokerUnavailable(f"{unsent} events not acknowledged")
        except BaseException as exc:
            self.error = exc

    def start(self) -> CommandWriter:
        self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop_after(self, more_rounds: int, timeout: float = 120.0) -> None:
        """Write ``more_rounds`` more rounds, then stop; re-raise whatever stopped the writer."""
        self.last_round = min(self.last_round, self.rounds + more_rounds)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the writer did not finish within {timeout}s")
        if self.error is not None:
            raise self.error


def _listed_ends(
    bootstrap: str, topic: str, partitions: int, isolation: Isolation
) -> dict[int, int]:
    """``{partition: end}`` as a consumer reading ``isolation`` is told by ListOffsets."""
    consumer = Consumer(consumer_config(bootstrap, isolation=isolation))
    try:
        return listed_ends(consumer, topic, range(partitions), 30.0)
    finally:
        consumer.close()


def await_settled(bootstrap: str, topic: str, partitions: int, timeout: float = 15.0) -> None:
    """Wait until every transaction open on ``topic`` now has ended (its markers written).

    A producer's commit returns once the coordinator decided; the coordinator writes the
    markers after, and until they land a committed read stops before the transaction."""
    written = _listed_ends(bootstrap, topic, partitions, "read_uncommitted")

    def behind() -> bool:
        stable = _listed_ends(bootstrap, topic, partitions, "read_committed")
        return any(stable[p] < end for p, end in written.items())

    try:
        Retrying(
            stop=stop_after_delay(timeout),
            wait=wait_fixed(0.05),
            retry=retry_if_result(bool),
        )(behind)
    except RetryError as exc:
        raise BrokerUnavailable(
            f"{topic}: a transaction open for {timeout}s (a writer paused or killed in it?)"
        ) from exc


def read_topic(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, int, bytes, bytes | None, list[tuple[str, bytes]]]]:
    """Every committed record of ``topic`` as (partition, offset, key, value, headers), once
    the transactions open at the call have ended (:func:`await_settled`)."""
    await_settled(bootstrap, topic, partitions)
    return [
        (m.partition(), m.offset(), m.key(), m.value(), list(m.headers() or ()))
        for batch in read_to_end(bootstrap, topic, partitions)
        for m in batch
    ]


def delete_topics_where(
    bootstrap: str, wanted: Callable[[str], bool], timeout: float = 30.0
) -> list[str]:
    """Delete every topic whose name ``wanted`` accepts, and wait until they are gone; their
    names."""
    admin = admin_client(bootstrap)
    names = sorted(t for t in admin.list_topics(timeout=timeout).topics if wanted(t))
    if names:
        _delete_and_wait(admin, names, timeout)
    return names


def create_again(bootstrap: str, specs: list[TopicSpec], timeout: float = 30.0) -> None:
    """Delete the topics of ``specs`` and create them again, empty (each gets a new topic id),
    as an operator would."""
    _delete_and_wait(admin_client(bootstrap), [s.name for s in specs], timeout)
    ensure_topics(bootstrap, specs)


def _delete_and_wait(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Delete the topics ``names`` (each must exist) and wait until the broker lists none."""
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        future.result()
    deadline = time.monotonic() + timeout
    while any(topic_partitions(admin, name) is not None for name in names):
        if time.monotonic() > deadline:
            raise BrokerUnavailable(f"topics {names} not deleted in {timeout}s")
        time.sleep(0.05)
