"""Membership: who is a member, what each serves, and the newest assignment, read from the
cluster topic.

Each instance publishes its own :class:`~foldstream.cluster.records.MemberState` to the
service's compacted cluster topic (key = instance id) twice a second and whenever it changes
(:class:`Heartbeat`), and tails the topic to learn everyone else's. A member whose record has not
been refreshed for ``liveness_s`` seconds is no longer a member: nothing is routed to it, and the
leader moves its partitions.

Silence is measured against this instance's own view of the topic, not the wall clock: each
heartbeat carries a ``beat`` number, and reading one's own beat back (sent at time T) proves that
everything appended before T has been read. A member is silent when its newest record was read
``liveness_s`` before the newest own beat read back. An instance whose reading stalls (a slow
broker, a busy process) therefore never declares the others dead for its own delay. A member
silent for ``suspect_s`` (less) is a *suspect*: still a member, keeping its partitions, but no
instance sends clients to it (:meth:`ClusterMap.suspects`). The listener hears of every member
that turns suspect, clears, or drops out, as of every record that changes the view.

The topic also holds the newest :class:`~foldstream.cluster.assignment.Assignment` (key
``ASSIGNMENT_KEY``), published by the leader (:mod:`.leader`). The topic is read uncommitted:
an assignment whose transaction a newer leader aborted is read too, and superseded by that
leader's next generation (the leader's fencing keeps a deposed leader from writing after).

Every record is untrusted input (:mod:`.records`): one that does not parse, or whose epoch or
generation leaps further than :data:`MAX_STEP` beyond the newest seen, is logged, counted and
ignored; nothing read can stop the thread that reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from foldstream.cluster.assignment import Assignment
from foldstream.cluster.records import (
    REBUILD_PREFIX,
    InvalidRecord,
    MemberState,
    RebuildRequest,
    parse_assignment,
    rebuild_key,
)
from foldstream.cluster.suspects import Suspicion
from foldstream.kafka import consume_available, consumer_config, producer_config

log = logging.getLogger(__name__)

#: The cluster topic's key for the assignment (member ids start with a letter or a digit).
ASSIGNMENT_KEY = b"__assignment__"
#: How far an epoch or a generation may leap beyond the newest one seen; a record claiming more
#: is taken for forged or corrupt. Real ones move by one per rebalance.
MAX_STEP = 1_000_000
#: Invalid records logged at most once per this many seconds (the count is always kept).
LOG_EVERY_S = 10.0
#: Stores a map keeps rebuild requests of: forged records naming ever new stores are invalid
#: past it, not memory (a service declares far fewer stores).
MAX_REBUILT_STORES = 1000


class ClusterMap:
    """Publishes this member's state to ``topic`` and follows every other member's."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        member_id: str,
        liveness_s: float = 3.0,
        suspect_s: float | None = None,
        on_change: Callable[[], None] | None = None,
        fetch_wait_max_ms: int = 10,
    ) -> None:
        """``suspect_s``: how long a member may be silent before it is a suspect (None: as
        long as ``liveness_s``, no suspects)."""
        self.topic = topic
        self.member_id = member_id
        self.liveness_s = liveness_s
        self.suspicion = Suspicion(
            member_id, liveness_s=liveness_s, suspect_s=suspect_s or liveness_s
        )
        self._on_change = on_change
        self._states: dict[str, MemberState] = {}
        self._seen_at: dict[str, float] = {}
        self._beats: dict[int, float] = {}  # own beats sent, not yet read back: beat -> sent at
        self._view_at = 0.0  # when the newest own beat read back was sent
        self._assignment = Assignment()
        self._rebuilds: dict[str, RebuildRequest] = {}  # replaced whole: read by other threads
        self._caught_up_at: float | None = None
        self._caught_up = threading.Event()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.invalid_records = 0
        self._invalid_logged_at = 0.0
        self._producer = Producer(producer_config(bootstrap, linger_ms=0))
        # read_uncommitted: a leader killed or paused inside its transaction would otherwise
        # hold every member's view (its own beats included) at that record until the broker
        # aborts it (transaction.timeout.ms, then the broker's periodic abort check), so no
        # member could notice it gone and take the role (measured: docs/decisions.md,
        # "Isolation levels").
        self._consumer = Consumer(
            consumer_config(
                bootstrap, fetch_wait_max_ms=fetch_wait_max_ms, isolation="read_uncommitted"
            )
        )
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self._thread = threading.Thread(target=self._run, name="cluster-map", daemon=True)

    def start(self) -> None:
        """Start reading the topic (``on_change`` is called from then on)."""
        self._thread.start()

    # -- publishing --------------------------------------------------------------------------

    def publish(self, state: MemberState) -> None:
        """Record ``state`` locally at once and send it to the other members."""
        with self._lock:
            # Nanoseconds since the epoch: never a beat of an earlier run of this member.
            beat = max(time.time_ns(), max(self._beats, default=0) + 1)
            self._beats[beat] = time.monotonic()
            state = state.model_copy(update={"beat": beat})
            changed = not state.same_as(self._states.get(state.id))
            self._states[state.id] = state
            self._seen_at[state.id] = time.monotonic()
        self._producer.produce(self.topic, key=state.id.encode(), value=state.to_json())
        self._producer.poll(0)
        if changed:
            self._changed()

    def adopt(self, assignment: Assignment) -> None:
        """Follow ``assignment`` at once (the leader published it) if it supersedes ours."""
        with self._lock:
            if not assignment.supersedes(self._assignment):
                return
            self._assignment = assignment
        self._changed()

    def request_rebuild(self, request: RebuildRequest) -> None:
        """Ask every member, now and later (the topic is compacted), to rebuild a store."""
        self._producer.produce(
            self.topic, key=rebuild_key(request.store), value=request.model_dump_json().encode()
        )
        self._producer.flush(10)

    def rebuilds(self) -> dict[str, RebuildRequest]:
        """The newest rebuild request read of each store (:mod:`.rebuilds`)."""
        return self._rebuilds

    def leave(self) -> None:
        """Tell the other members at once that this one is gone (a tombstone)."""
        self._producer.produce(self.topic, key=self.member_id.encode(), value=None)
        self._producer.flush(5)

    # -- the view ----------------------------------------------------------------------------

    def assignment(self) -> Assignment:
        """The newest assignment read or published (generation 0: none yet)."""
        return self._assignment

    def caught_up(self, timeout: float = 0.0) -> bool:
        """True once the topic has been read to its end (what was there when this one started)."""
        return self._caught_up.wait(timeout)

    def caught_up_for(self) -> float:
        """Seconds since the topic was first read to its end (0 before)."""
        at = self._caught_up_at
        return 0.0 if at is None else time.monotonic() - at

    def view_at(self) -> float:
        """When (monotonic) the newest own beat read back was sent: everything appended to the
        topic before then has been read."""
        return self._view_at

    def view_is_current(self) -> bool:
        """Whether a beat sent less than ``liveness_s`` ago has been read back: the view is as
        young as the others' patience. False after this process stood still that long (a
        pause, a starved machine) until a beat sent since is read back: the assignment read
        before may be one the others replaced after giving this member up, and claiming from
        it would fence the new owners. (A current view may still miss a newer assignment; the
        claim protocol waits for its owners then, it does not fence them.)"""
        return time.monotonic() - self._view_at < self.liveness_s

    def members(self) -> dict[str, MemberState]:
        """Live members by id (this one always included once it has published), suspects
        among them."""
        with self._lock:
            return {
                member_id: state
                for member_id, state in self._states.items()
                if member_id == self.member_id or self._silent_for(member_id) < self.liveness_s
            }

    def suspects(self) -> frozenset[str]:
        """The live members silent for ``suspect_s`` or more in this member's view: nothing
        is routed to them (they may be dead: the session timeout says so later)."""
        with self._lock:
            return self.suspicion.standing(self._silences())[1]

    def _silent_for(self, member_id: str) -> float:
        """How long before the newest own beat read back ``member_id``'s newest record was
        read (under the lock)."""
        return self._view_at - self._seen_at[member_id]

    def _silences(self) -> dict[str, float]:
        """Every other member's :meth:`_silent_for` (under the lock)."""
        return {m: self._silent_for(m) for m in self._states if m != self.member_id}

    def max_epoch(self) -> int:
        with self._lock:
            return max((s.epoch for s in self._states.values()), default=0)

    def active_owner(self, topic: str, partition: int) -> MemberState | None:
        """The live member serving ``partition`` of ``topic``: the one the assignment names when
        it claims the partition, else the claim with the newest epoch (a handover under way)."""
        members = self.members()
        named = members.get(self._assignment.owner(topic, partition) or "")
        if named is not None and partition in named.active.get(topic, ()):
            return named
        claims = [s for s in members.values() if partition in s.active.get(topic, ())]
        return max(claims, key=lambda s: s.epoch, default=None)

    # -- reading the topic -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                messages = consume_available(self._consumer, 1_000, 0.1)
            except Exception:  # noqa: BLE001 - a broken fetch is retried; never fatal
                log.warning("reading %s failed; retrying", self.topic, exc_info=True)
                self._stopping.wait(0.5)
                continue
            changed = False
            with self._lock:
                for message in messages:
                    try:
                        changed |= self._read(message)
                    except InvalidRecord as exc:
                        self._invalid(message, str(exc))
                    except Exception as exc:  # noqa: BLE001 - one record never stops the map
                        self._invalid(message, f"{type(exc).__name__}: {exc}")
                changed |= self.suspicion.changed(self._silences())
            if changed:
                self._changed()

    def _read(self, message: Any) -> bool:
        """Take one record in (under the lock); whether the view changed."""
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                if not self._caught_up.is_set():
                    self._caught_up_at = time.monotonic()
                    self._caught_up.set()
                return False
            raise InvalidRecord(f"consumer error {error}")
        key = message.key()
        if key == ASSIGNMENT_KEY:
            return self._adopt_record(message.value())
        if key is None:
            raise InvalidRecord("a record without a key")
        if key.startswith(REBUILD_PREFIX):
            return self._rebuild_record(key, message.value())
        try:
            member_id = key.decode()
        except UnicodeDecodeError:
            raise InvalidRecord("a key that is not UTF-8") from None
        if member_id == self.member_id:
            self._read_back(message.value())
            return False  # our own record is always current locally
        if message.value() is None:
            self._seen_at.pop(member_id, None)
            return self._states.pop(member_id, None) is not None
        state = MemberState.from_json(message.value())
        if state.id != member_id:
            raise InvalidRecord(f"record of {state.id!r} under the key {member_id!r}")
        newest_epoch = max((s.epoch for s in self._states.values()), default=0)
        self._check_step("epoch", state.epoch, newest_epoch)
        self._check_step("generation", state.generation, self._assignment.generation)
        changed = not state.same_as(self._states.get(member_id))
        self._states[member_id] = state
        self._seen_at[member_id] = time.monotonic()
        return changed

    def _check_step(self, name: str, value: int, newest: int) -> None:
        if newest and value > newest + MAX_STEP:
            raise InvalidRecord(f"{name} {value} leaps more than {MAX_STEP} beyond {newest}")

    def _read_back(self, raw: bytes | None) -> None:
        try:
            beat = MemberState.from_json(raw or b"").beat
        except InvalidRecord:
            return  # a tombstone, or a record of an earlier version of this instance
        sent = self._beats.get(beat)
        if sent is not None:
            self._view_at = max(self._view_at, sent)
            for older in [b for b in self._beats if b <= beat]:
                del self._beats[older]

    def _adopt_record(self, raw: bytes | None) -> bool:
        assignment = parse_assignment(raw)
        self._check_step("generation", assignment.generation, self._assignment.generation)
        if not assignment.supersedes(self._assignment):
            return False
        self._assignment = assignment
        return True

    def _rebuild_record(self, key: bytes, raw: bytes | None) -> bool:
        request = RebuildRequest.from_record(key, raw)
        known = self._rebuilds.get(request.store)
        if known is None and len(self._rebuilds) >= MAX_REBUILT_STORES:
            raise InvalidRecord(f"a rebuild request of more than {MAX_REBUILT_STORES} stores")
        if known is not None and (known.version, known.generation) >= (
            request.version,
            request.generation,
        ):
            return False
        self._rebuilds = {**self._rebuilds, request.store: request}
        return True

    def _invalid(self, message: Any, reason: str) -> None:
        self.invalid_records += 1
        now = time.monotonic()
        if now - self._invalid_logged_at >= LOG_EVERY_S:
            self._invalid_logged_at = now
            log.warning(
                "ignoring an invalid record at offset %s of %s: %s (%d invalid so far)",
                message.offset(),
                self.topic,
                reason[:300],
                self.invalid_records,
            )

    def _changed(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change()
        except Exception:  # noqa: BLE001 - the reader goes on whatever the listener does
            log.exception("reacting to a change of the cluster map failed")

    def snapshot(self) -> dict[str, Any]:
        """The map as served at ``GET /cluster``."""
        now = time.monotonic()
        members = self.members()
        with self._lock:
            ages = {m: round(now - self._seen_at[m], 3) for m in members}
            suspects = self.suspicion.standing(self._silences())[1]
        assignment = self._assignment
        return {
            "generation": assignment.generation,
            "leader": assignment.leader,
            "view_current": self.view_is_current(),
            "instances": [
                {
                    **state.model_dump(),
                    "last_seen_s": ages[member_id],
                    "suspect": member_id in suspects,
                }
                for member_id, state in sorted(members.items())
            ],
        }

    def close(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._consumer.close()
        self._producer.flush(5)
