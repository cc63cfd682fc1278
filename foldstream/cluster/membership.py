"""Partition ownership through Kafka's own consumer-group protocol.

Every instance of a service joins one consumer group subscribed to the service's source topics:
the group decides which instance is the active owner of each source partition. The eager
protocol is used on purpose: every rebalance revokes all partitions from every member before
any is assigned, so two members can never both believe they own a partition, even with a
coordinator whose incremental (cooperative) rebalancing is unreliable (seen with Tansu 0.6: a
partition assigned to a new member without being revoked from its owner). The members never
fetch data through this consumer (every assigned partition is paused); it exists for
membership and assignment only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaError, TopicPartition

log = logging.getLogger(__name__)

TopicPartitions = frozenset[tuple[str, int]]


class GroupMembership:
    """Joins ``group`` for ``topics``; reports gained and lost ``(topic, partition)`` pairs.

    ``on_revoked`` runs on the membership thread before the group may hand the partitions to
    another member: it must stop every write to them before it returns. ``on_assigned`` runs
    there too and should only schedule work.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        group: str,
        topics: Sequence[str],
        client_id: str,
        on_assigned: Callable[[TopicPartitions], None],
        on_revoked: Callable[[TopicPartitions], None],
        session_timeout_ms: int = 3000,
    ) -> None:
        self.topics = list(topics)
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._owned: set[tuple[str, int]] = set()
        self._joined = threading.Event()
        self._stopping = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": client_id,
                "partition.assignment.strategy": "roundrobin",
                "session.timeout.ms": session_timeout_ms,
                "heartbeat.interval.ms": max(100, session_timeout_ms // 10),
                # Also bounds how long a rebalance waits for members to rejoin.
                "max.poll.interval.ms": max(session_timeout_ms * 3, 10000),
                "enable.auto.commit": False,
                "auto.offset.reset": "latest",
            }
        )
        self._thread = threading.Thread(target=self._run, name="group-membership", daemon=True)

    def start(self) -> None:
        self._consumer.subscribe(
            self.topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke
        )
        self._thread.start()

    def owned(self) -> TopicPartitions:
        return frozenset(self._owned)

    def wait_joined(self, timeout: float) -> bool:
        """True once the group has given this member its first assignment (possibly empty)."""
        return self._joined.wait(timeout)

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gained = frozenset((tp.topic, tp.partition) for tp in partitions)
        consumer.assign(partitions)
        if partitions:
            consumer.pause(partitions)
        self._owned = set(gained)
        self._joined.set()
        log.info("assigned %s", sorted(gained))
        if gained:
            self._on_assigned(gained)

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = frozenset((tp.topic, tp.partition) for tp in partitions) | frozenset(self._owned)
        log.info("revoked %s", sorted(lost))
        self._owned = set()
        try:
            if lost:
                self._on_revoked(lost)
        finally:
            consumer.unassign()

    def _run(self) -> None:
        while not self._stopping.is_set():
            message = self._consumer.poll(0.1)
            error = message.error() if message is not None else None
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                log.warning("group membership: %s", error)

    def close(self) -> None:
        """Leave the group (its partitions are revoked through ``on_revoked`` first)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._consumer.close()
