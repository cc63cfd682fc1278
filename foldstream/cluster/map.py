"""The cluster map: who is a member, what each serves, and the assignment they all follow.

Each instance publishes its own :class:`MemberState` to the service's compacted cluster topic
(key = instance id) twice a second and whenever it changes, and tails the topic to learn
everyone else's. A member whose record has not been refreshed for ``liveness_s`` seconds is no
longer a member: nothing is routed to it, and the leader moves its partitions.

Silence is measured against this instance's own view of the topic, not the wall clock: each
heartbeat carries a ``beat`` number, and reading one's own beat back (sent at time T) proves that
everything appended before T has been read. A member is silent when its newest record was read
``liveness_s`` before the newest own beat read back. An instance whose reading stalls (a slow
broker, a busy process) therefore never declares the others dead for its own delay.

The topic also holds the newest :class:`Assignment` (key ``ASSIGNMENT_KEY``). Two live claims
on one partition (a dead owner's last record against its successor's) are settled by ``epoch``,
a Lamport clock every instance advances when it gains partitions.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from foldstream.cluster.assignment import Assignment
from foldstream.kafka import consume_available, consumer_config, producer_config

log = logging.getLogger(__name__)

#: The cluster topic's key for the assignment (member ids are service names, never this).
ASSIGNMENT_KEY = b"__assignment__"


@dataclass(frozen=True)
class MemberState:
    """What one instance publishes about itself.

    ``active`` and ``standby`` map a source topic to partitions; ``lag`` maps
    ``"<store>/<partition>"`` to records not yet applied (source records for an active copy,
    changelog records for a standby). ``generation`` is the newest assignment the member has
    applied: it has released every partition that assignment does not give it.
    """

    id: str
    url: str
    epoch: int = 0
    generation: int = 0
    beat: int = field(default=0, compare=False)  # set by ClusterMap.publish
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
        self._beats: dict[int, float] = {}  # own beats sent, not yet read back: beat -> sent at
        self._view_at = 0.0  # when the newest own beat read back was sent
        self._assignment = Assignment()
        self._caught_up = threading.Event()
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
            # Nanoseconds since the epoch: never a beat of an earlier run of this member.
            beat = max(time.time_ns(), max(self._beats, default=0) + 1)
            self._beats[beat] = time.monotonic()
            state = replace(state, beat=beat)
            changed = self._states.get(state.id) != state
            self._states[state.id] = state
            self._seen_at[state.id] = time.monotonic()
        self._producer.produce(self.topic, key=state.id.encode(), value=state.to_json())
        self._producer.poll(0)
        if changed and self._on_change is not None:
            self._on_change()

    def publish_assignment(self, assignment: Assignment) -> None:
        """Adopt ``assignment`` locally if it supersedes the current one, and send it."""
        with self._lock:
            if not assignment.supersedes(self._assignment):
                return
            self._assignment = assignment
        self._producer.produce(self.topic, key=ASSIGNMENT_KEY, value=assignment.to_json())
        self._producer.poll(0)
        if self._on_change is not None:
            self._on_change()

    def assignment(self) -> Assignment:
        """The newest assignment read or published (generation 0: none yet)."""
        return self._assignment

    def caught_up(self, timeout: float = 0.0) -> bool:
        """True once the topic has been read to its end (what was there when this one started)."""
        return self._caught_up.wait(timeout)

    def leave(self) -> None:
        """Tell the other members at once that this one is gone (a tombstone)."""
        self._producer.produce(self.topic, key=self.member_id.encode(), value=None)
        self._producer.flush(5)

    def members(self) -> dict[str, MemberState]:
        """Live members by id (this one always included once it has published)."""
        with self._lock:
            return {
                member_id: state
                for member_id, state in self._states.items()
                if member_id == self.member_id
                or self._view_at - self._seen_at[member_id] < self.liveness_s
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

    def _run(self) -> None:
        while not self._stopping.is_set():
            messages = consume_available(self._consumer, 1_000, 0.1)
            changed = False
            with self._lock:
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            self._caught_up.set()
                        continue
                    if message.key() == ASSIGNMENT_KEY:
                        changed |= self._adopt(message.value())
                        continue
                    if message.key() is None:
                        continue
                    member_id = message.key().decode()
                    if member_id == self.member_id:
                        self._read_back(message.value())
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

    def _read_back(self, raw: bytes | None) -> None:
        try:
            beat = json.loads(raw or b"null")["beat"]
        except (ValueError, TypeError, KeyError):
            return  # a tombstone, or a record from before this instance restarted
        sent = self._beats.get(beat)
        if sent is not None:
            self._view_at = max(self._view_at, sent)
            for older in [b for b in self._beats if b <= beat]:
                del self._beats[older]

    def _adopt(self, raw: bytes | None) -> bool:
        try:
            assignment = Assignment.from_json(raw or b"")
        except (ValueError, TypeError):
            log.warning("ignoring a malformed assignment record")
            return False
        if not assignment.supersedes(self._assignment):
            return False
        self._assignment = assignment
        return True

    def snapshot(self) -> dict[str, Any]:
        """The map as served at ``GET /cluster``."""
        now = time.monotonic()
        members = self.members()
        with self._lock:
            ages = {m: round(now - self._seen_at[m], 3) for m in members}
        assignment = self._assignment
        return {
            "generation": assignment.generation,
            "leader": assignment.leader,
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
