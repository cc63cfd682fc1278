"""The cluster map: which instance serves which partition, and how far behind each copy is.

Each instance publishes its own :class:`MemberState` to the service's compacted cluster topic
(key = instance id) about once a second and whenever it changes, and tails the topic to learn
everyone else's. A member whose record has not been refreshed for ``liveness_s`` seconds (as
measured by the receiving instance's own clock) is no longer a member: nothing is routed to it.
Two live claims on one partition (a dead owner's last record against its successor's) are
settled by ``epoch``, a Lamport clock every instance advances when it gains partitions.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from foldstream.kafka import consume_available, consumer_config, producer_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemberState:
    """What one instance publishes about itself.

    ``active`` and ``standby`` map a source topic to partitions; ``lag`` maps
    ``"<store>/<partition>"`` to records not yet applied (source records for an active copy,
    changelog records for a standby).
    """

    id: str
    url: str
    epoch: int = 0
    active: dict[str, list[int]] = field(default_factory=dict)
    restoring: dict[str, list[int]] = field(default_factory=dict)
    standby: dict[str, list[int]] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MemberState:
        return cls(**json.loads(raw))


class ClusterMap:
    """Publishes this member's state to ``topic`` and follows every other member's."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        member_id: str,
        liveness_s: float = 3.0,
        on_change: Callable[[], None] | None = None,
        fetch_wait_max_ms: int = 10,
    ) -> None:
        self.topic = topic
        self.member_id = member_id
        self.liveness_s = liveness_s
        self._on_change = on_change
        self._states: dict[str, MemberState] = {}
        self._seen_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._producer = Producer(producer_config(bootstrap, linger_ms=0))
        self._consumer = Consumer(consumer_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms))
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self._thread = threading.Thread(target=self._run, name="cluster-map", daemon=True)
        self._thread.start()

    def publish(self, state: MemberState) -> None:
        """Record ``state`` locally at once and send it to the other members."""
        with self._lock:
            changed = self._states.get(state.id) != state
            self._states[state.id] = state
            self._seen_at[state.id] = time.monotonic()
        self._producer.produce(self.topic, key=state.id.encode(), value=state.to_json())
        self._producer.poll(0)
        if changed and self._on_change is not None:
            self._on_change()

    def leave(self) -> None:
        """Tell the other members at once that this one is gone (a tombstone)."""
        self._producer.produce(self.topic, key=self.member_id.encode(), value=None)
        self._producer.flush(5)

    def members(self) -> dict[str, MemberState]:
        """Live members by id (this one always included once it has published)."""
        now = time.monotonic()
        with self._lock:
            return {
                member_id: state
                for member_id, state in self._states.items()
                if member_id == self.member_id or now - self._seen_at[member_id] < self.liveness_s
            }

    def max_epoch(self) -> int:
        with self._lock:
            return max((s.epoch for s in self._states.values()), default=0)

    def active_owner(self, topic: str, partition: int) -> MemberState | None:
        """The live member serving ``partition`` of ``topic`` (the newest claim wins)."""
        claims = [
            state for state in self.members().values() if partition in state.active.get(topic, ())
        ]
        return max(claims, key=lambda s: s.epoch, default=None)

    def standbys(self, topic: str, partition: int) -> list[MemberState]:
        """Live members that hold a standby copy of ``partition`` of ``topic``."""
        return [
            state
            for state in self.members().values()
            if partition in state.standby.get(topic, ())
            and partition not in state.active.get(topic, ())
        ]

    def standby_placement(self, topic: str, partition: int, replicas: int) -> list[str] | None:
        """Ids of the members that should keep standby copies of a partition: the ``replicas``
        members after its active owner in id order. None while the partition has no owner."""
        owner = self.active_owner(topic, partition)
        if owner is None or replicas <= 0:
            return None
        ring = sorted(self.members())
        start = ring.index(owner.id)
        return [ring[(start + i) % len(ring)] for i in range(1, min(replicas, len(ring) - 1) + 1)]

    def _run(self) -> None:
        while not self._stopping.is_set():
            messages = consume_available(self._consumer, 1_000, 0.1)
            changed = False
            with self._lock:
                for message in messages:
                    if message.error() is not None or message.key() is None:
                        continue
                    member_id = message.key().decode()
                    if member_id == self.member_id:
                        continue  # our own record is always current locally
                    if message.value() is None:
                        changed |= self._states.pop(member_id, None) is not None
                        self._seen_at.pop(member_id, None)
                        continue
                    try:
                        state = MemberState.from_json(message.value())
                    except (ValueError, TypeError):
                        log.warning("ignoring a malformed cluster record for %s", member_id)
                        continue
                    changed |= self._states.get(member_id) != state
                    self._states[member_id] = state
                    self._seen_at[member_id] = time.monotonic()
            if changed and self._on_change is not None:
                self._on_change()

    def snapshot(self) -> dict[str, Any]:
        """The map as served at ``GET /cluster``."""
        now = time.monotonic()
        members = self.members()
        with self._lock:
            ages = {m: round(now - self._seen_at[m], 3) for m in members}
        return {
            "generation": max((s.epoch for s in members.values()), default=0),
            "instances": [
                {**asdict(state), "last_seen_s": ages[member_id]}
                for member_id, state in sorted(members.items())
            ],
        }

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._consumer.close()
        self._producer.flush(5)
