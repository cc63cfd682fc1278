"""One instance's part in its service's cluster.

The members share the service's partitions through the cluster topic (:mod:`.map`): the live
member with the smallest id plans a sticky, standby-aware assignment (:mod:`.assignment`) and
every member follows the newest one. A member first releases what the assignment takes from it
(stops serving and writing it) and says so by publishing the generation it has applied. It
takes a partition only once every other live member has applied that generation and none claims
the partition, so two members never write one partition, even while the map is in flux.

Taking over a partition means taking over its stores (a warm standby copy, or the changelog when
there is none, only the missing tail being read), serving reads from them, starting the
projection from the source offset the copy carries, then giving the command handler the
partition. The node also keeps the standby copies the assignment gives it, publishes what it
serves and how far behind each copy is, and answers :meth:`locate` for the HTTP routes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from foldstream.changelog import StandbyReplicas, StoreLayout, restore
from foldstream.cluster.assignment import Assignment, plan
from foldstream.cluster.lag import LagMeter, partition_lag, unmeasured
from foldstream.cluster.map import ClusterMap, MemberState
from foldstream.errors import PartitionFenced
from foldstream.offsets import EndOffsets
from foldstream.query_api.stores import StoreReaders
from foldstream.routing import Local, Location, Redirect, Unavailable
from foldstream.settings import Settings

log = logging.getLogger(__name__)
PUBLISH_INTERVAL_S = 0.5
LEAD_INTERVAL_S = 0.1
TAKEOVER_RETRY_S = 1.0
TopicPartitions = frozenset[tuple[str, int]]


class PartitionWriters(Protocol):
    """What the node drives when ownership changes (the command handler)."""

    def assign(self, partitions: Iterable[int]) -> int: ...

    def revoke(self, partitions: Iterable[int]) -> None: ...

    def owned(self) -> frozenset[int]: ...


class Projections(Protocol):
    def run(self, owned: Mapping[str, Iterable[int]]) -> None: ...

    def failure(self) -> str | None: ...


class ClusterNode:
    """Ties the cluster map, the assignment, standby copies, projections and commands together.

    ``stores`` maps each store to its source and changelog topics; ``topics`` maps each source
    topic to its partition count.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        member_id: str,
        stores: Mapping[str, StoreLayout],
        topics: Mapping[str, int],
        readers: StoreReaders,
        replicas: StandbyReplicas,
        projections: Projections,
        commands: PartitionWriters | None,
        ends: Mapping[str, EndOffsets],
    ) -> None:
        self.settings = settings
        self.member_id = member_id
        self.stores = dict(stores)
        self.topics = dict(topics)
        self.readers = readers
        self.replicas = replicas
        self.projections = projections
        self.commands = commands
        self.lag = LagMeter(
            bootstrap=settings.bootstrap_servers,
            stores=stores,
            readers=readers,
            replicas=replicas,
            ends=ends,
        )
        self._serving: set[tuple[str, int]] = set()
        self._restoring: set[tuple[str, int]] = set()
        self._applied = 0  # the assignment generation whose releases are done
        self._routes: dict[tuple[str, int], tuple[str | None, list[tuple[str, int | None]]]] = {}
        self._epoch = 0
        self._lock = threading.RLock()
        self._commands_lock = threading.Lock()
        # Held while choosing and opening standby copies, and while a takeover releases its
        # copies: a copy chosen from a view older than the takeover is never opened after the
        # takeover released it (both would open one RocksDB in this process).
        self._copies_lock = threading.Lock()
        self._gains: queue.Queue[TopicPartitions | None] = queue.Queue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._failure: str | None = None
        self._started_at = time.monotonic()
        self.map = ClusterMap(
            bootstrap=settings.bootstrap_servers,
            topic=settings.cluster_topic,
            member_id=member_id,
            liveness_s=settings.session_timeout_ms / 1000,
            on_change=self._wake.set,
            fetch_wait_max_ms=settings.background_fetch_wait_max_ms,
        )
        self._threads = [
            threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True),
            threading.Thread(target=self._take_over_loop, name="takeover", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="cluster-heartbeat", daemon=True),
            threading.Thread(target=self._maintain_loop, name="cluster-maintain", daemon=True),
        ]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, join_timeout: float = 60.0) -> None:
        """Announce this member and wait until it follows an assignment (possibly empty)."""
        log.info("member %s at %s joining the cluster", self.member_id, self.settings.url)
        self.publish()
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + join_timeout
        while self._applied == 0 and time.monotonic() < deadline:
            self._wake.wait(0.05)
        if self._applied == 0:
            log.warning("no assignment yet after %.0fs", join_timeout)

    def close(self) -> None:
        """Stop writing and serving, then leave (the others take the partitions at once)."""
        self._stopping.set()
        self._wake.set()
        self._gains.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            held = frozenset(self._serving | self._restoring)
        if held:
            self._revoked(held)
        self.map.leave()
        self.map.close()

    # -- following the assignment ----------------------------------------------------------

    def assigned(self) -> TopicPartitions:
        """Partitions the newest assignment gives this instance."""
        return self.map.assignment().owned_by(self.member_id)

    def _reconcile_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(LEAD_INTERVAL_S)
            self._wake.clear()
            if self._stopping.is_set() or not self.map.caught_up():
                continue
            try:
                # On every change of the map (at least each LEAD_INTERVAL_S): in a failover,
                # lookups go to a partition's new owner as soon as it claims the partition.
                self._build_routes()
                self._reconcile(self.map.assignment())
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("following the assignment failed")

    def _reconcile(self, assignment: Assignment) -> None:
        mine = assignment.owned_by(self.member_id)
        with self._lock:
            lost = frozenset((self._serving | self._restoring) - mine)
        if lost:
            self._revoked(lost)
        if assignment.generation != self._applied:
            self._applied = assignment.generation
            self.publish()
        with self._lock:
            claimable = mine - self._serving - self._restoring
        if claimable and self._released_by_others(assignment, claimable):
            with self._lock:
                self._restoring |= claimable
                self._epoch = max(self._epoch, self.map.max_epoch()) + 1
            self.publish()
            self._gains.put(frozenset(claimable))

    def _released_by_others(self, assignment: Assignment, wanted: TopicPartitions) -> bool:
        """Whether every other live member has applied ``assignment`` and claims none of
        ``wanted``: a member that has not applied it may still be taking one of them over
        under an older assignment."""
        for member_id, state in self.map.members().items():
            if member_id == self.member_id:
                continue
            if state.generation < assignment.generation:
                return False
            claimed = [state.active, state.restoring]
            if any(p in c.get(topic, ()) for topic, p in wanted for c in claimed):
                return False
        return True

    def _revoked(self, lost: TopicPartitions) -> None:
        # Stops everything that writes the partitions (the projection queries, the command
        # handler) before returning: only then may another member take them.
        with self._lock:
            self._serving -= lost
            self._restoring -= lost
            serving = set(self._serving)
        self.publish()
        self.projections.run(_by_topic(serving))
        if self.commands is not None:
            events = [p for t, p in lost if t == self.settings.events_topic]
            if events:
                with self._commands_lock:
                    self.commands.revoke(events)
        self.readers.release(self._store_keys(lost))

    def _take_over_loop(self) -> None:
        while not self._stopping.is_set():
            gained = self._gains.get()
            if gained is None:
                return
            try:
                self._take_over(gained)
                self._failure = None
            except Exception as exc:  # noqa: BLE001 - reported through /ready and the log
                log.exception("taking over %s failed; trying again", sorted(gained))
                self._failure = f"taking over {sorted(gained)} failed: {exc}"
                # Given back to the reconcile loop, which claims them again if still ours.
                self._stopping.wait(TAKEOVER_RETRY_S)
                with self._lock:
                    self._restoring -= gained
                self._wake.set()

    def _take_over(self, gained: TopicPartitions) -> None:
        started = time.monotonic()
        keys = self._store_keys(gained)
        with self._copies_lock:
            self.replicas.release(keys)
        # A partition still held here (taken again after a failed transaction) is current.
        fresh = [key for key in keys if not self.readers.holds(*key)]
        restored = 0
        held: list[tuple[str, int]] = []
        with self._lock:
            epoch = self._epoch
        try:
            for store, partition in fresh:
                restored += restore(
                    bootstrap=self.settings.bootstrap_servers,
                    state_dir=self.settings.state_dir,
                    store=store,
                    layout=self.stores[store],
                    partition=partition,
                    fetch_wait_max_ms=self.settings.fetch_wait_max_ms,
                )
                identity = self.stores[store].identity(partition)
                # Above every epoch its changelog holds, and published below before any write:
                # the next owner's epoch is then above this one's, which fences our records.
                epoch = max(
                    epoch, self.readers.hold(store, partition, identity=identity, epoch=epoch)
                )
                held.append((store, partition))
        except BaseException:
            self.readers.release(held)
            raise
        with self._lock:
            self._epoch = max(self._epoch, epoch)
            # A partition released meanwhile is in neither set (one taken again after a
            # failed transaction is still serving).
            still_owned = gained & (self._restoring | self._serving)
            self._restoring -= gained
            self._serving |= still_owned
            serving = set(self._serving)
        # Its revocation found it not serving yet, so it is released here.
        self.readers.release(set(held) - set(self._store_keys(still_owned)))
        # Reads are served from the restored copies at once; the projection catches up after,
        # and commands wait (503) until the handler has replayed its partitions.
        self.publish()
        log.info(
            "serving %s after restoring %d changelog records in %.2fs",
            sorted(still_owned),
            restored,
            time.monotonic() - started,
        )
        self.projections.run(_by_topic(serving))
        if self.commands is not None:
            # Under the lock the revocation takes too: a partition revoked meanwhile is never
            # handed to the command handler (whose producer would fence the new owner's).
            with self._commands_lock:
                with self._lock:
                    events = [
                        p for t, p in still_owned & self._serving if t == self.settings.events_topic
                    ]
                if events:
                    self.commands.assign(events)

    def released(self, partition: int, error: Exception) -> None:
        """The command handler gave ``partition`` up after a failed transaction: fenced means
        another member writes it now (stop serving it here); otherwise take it over again."""
        key = (self.settings.events_topic, partition)
        if isinstance(error, PartitionFenced):
            log.error("partition %d: %s; dropping it", partition, error)
            threading.Thread(target=self._revoked, args=(frozenset({key}),), daemon=True).start()
        elif key in self.assigned():
            self._gains.put(frozenset({key}))

    # -- leading ---------------------------------------------------------------------------

    def _lead(self) -> None:
        """Plan and publish a new assignment when this is the leader and the plan changed.

        The leader is the live member with the smallest id. A member only starts leading once
        its view of the members is its own: it has read the cluster topic to its end, and the
        records it read from before it started have had time to expire.
        """
        members = self.map.members()
        if min(members, default=None) != self.member_id or not self.map.caught_up():
            return
        if len(members) > 1 and time.monotonic() - self._started_at < self.map.liveness_s:
            return
        current = self.map.assignment()
        planned = plan(
            self.topics,
            members,
            current,
            standby_replicas=self.settings.standby_replicas,
            copy_lag=lambda member, topic, p: _copy_lag(self.stores, members[member], topic, p),
        )
        if current.generation and current.same_plan(planned) and current.members == sorted(members):
            return
        new = Assignment(current.generation + 1, self.member_id, *planned, sorted(members))
        log.info(
            "assignment generation %d for %s: active %s, standby %s, warming up %s",
            new.generation,
            sorted(members),
            new.active,
            new.standby,
            new.warmups,
        )
        self.map.publish_assignment(new)

    # -- the cluster map -------------------------------------------------------------------

    def state(self) -> MemberState:
        with self._lock:
            serving, restoring = set(self._serving), set(self._restoring)
            epoch = self._epoch
        return MemberState(
            id=self.member_id,
            url=self.settings.url,
            epoch=epoch,
            generation=self._applied,
            active=_by_topic(serving),
            restoring=_by_topic(restoring),
            standby=_by_topic(self._standby_partitions()),
            lag=dict(self.lag.last),
        )

    def publish(self) -> None:
        self.map.publish(self.state())

    def _standby_partitions(self) -> set[tuple[str, int]]:
        topic_of = {store: layout.source_topic for store, layout in self.stores.items()}
        return {(topic_of[store], p) for store, p in self.replicas.held()}

    def _store_keys(self, partitions: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        return [
            (store, p)
            for topic, p in partitions
            for store, layout in self.stores.items()
            if layout.source_topic == topic
        ]

    def _heartbeat_loop(self) -> None:
        # Kept apart from the slower upkeep below: a late heartbeat makes others think this
        # member is dead.
        last = 0.0
        awake = time.monotonic()
        while not self._stopping.wait(LEAD_INTERVAL_S):
            now = time.monotonic()
            if now - awake > self.map.liveness_s:
                self._gave_up_after_pause(now - awake)
            awake = now
            try:
                self._lead()
                if time.monotonic() - last >= PUBLISH_INTERVAL_S:
                    self.publish()
                    last = time.monotonic()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("cluster heartbeat failed")

    def _gave_up_after_pause(self, paused_s: float) -> None:
        """This process stood still for longer than the session timeout (a long pause, a
        frozen machine): the others may have taken its partitions over meanwhile. Give them
        all up at once; the ones still assigned here are taken again, restored from their
        changelogs and written with a new epoch."""
        with self._lock:
            held = frozenset(self._serving | self._restoring)
        if held:
            log.warning(
                "this instance stood still for %.1fs, longer than the session timeout: giving up "
                "%s",
                paused_s,
                sorted(held),
            )
            threading.Thread(target=self._revoked, args=(held,), daemon=True).start()

    def _maintain_loop(self) -> None:
        while not self._stopping.wait(PUBLISH_INTERVAL_S):
            try:
                self._fence_superseded()
                self._keep_standbys()
                with self._lock:
                    serving = set(self._serving)
                self.lag.measure(serving)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("cluster map round failed")

    def _fence_superseded(self) -> None:
        # A member that missed its own revocation (a long pause) must not go on serving: when
        # a live member claims one of our partitions with a newer epoch, drop it here too.
        with self._lock:
            serving, epoch = set(self._serving), self._epoch
        superseded = frozenset(
            key
            for key in serving
            if (owner := self.map.active_owner(*key)) is not None
            and owner.id != self.member_id
            and owner.epoch > epoch
        )
        if superseded:
            log.warning("%s now served by a newer owner: dropping them", sorted(superseded))
            self._revoked(superseded)

    def _keep_standbys(self) -> None:
        assignment = self.map.assignment()
        if assignment.generation == 0:
            return
        with self._copies_lock:
            with self._lock:
                mine = self._serving | self._restoring | self.assigned()
            wanted = assignment.standby_of(self.member_id) - mine
            # Not one still held as active (its revocation is under way): both would open it.
            held = self.readers.held()
            self.replicas.assign([k for k in self._store_keys(wanted) if k not in held])

    def _build_routes(self) -> None:
        routes: dict[tuple[str, int], tuple[str | None, list[tuple[str, int | None]]]] = {}
        members = self.map.members()
        for topic, count in self.topics.items():
            for p in range(count):
                owner = self.map.active_owner(topic, p)
                standbys = [
                    (s.url, partition_lag(s.lag, self.stores, topic, p))
                    for s in members.values()
                    if p in s.standby.get(topic, ()) and s is not owner
                ]
                routes[(topic, p)] = (owner.url if owner is not None else None, standbys)
        self._routes = routes

    def snapshot(self) -> dict[str, Any]:
        """``GET /cluster``: members, and each partition's active and standby URLs with lag."""
        self._build_routes()
        partitions: dict[str, dict[str, Any]] = {}
        for (topic, p), (active, standbys) in sorted(self._routes.items()):
            partitions.setdefault(topic, {})[str(p)] = {
                "active": active,
                "standbys": [{"url": url, "lag": lag} for url, lag in standbys],
            }
        return {
            **self.map.snapshot(),
            "settled": self._settled(),
            "partitions": partitions,
            "stores": {
                store: {
                    "topic": info.topic,
                    "partitions": info.partitions,
                    "partitioner": info.partitioner,
                }
                for store, info in self.readers.layout.items()
            },
        }

    def _settled(self) -> bool:
        """Whether the assignment was planned for the live members and every partition is
        served by the owner it names, with no move waiting for a warm-up."""
        assignment = self.map.assignment()
        if assignment.generation == 0 or any(assignment.warmups.values()):
            return False
        if assignment.members != sorted(self.map.members()):
            return False  # the leader has yet to plan for a member that joined or left
        for (topic, p), (active, _) in self._routes.items():
            owner = assignment.owner(topic, p)
            state = self.map.members().get(owner) if owner is not None else None
            if state is None or active != state.url:
                return False
        return True

    # -- routing ---------------------------------------------------------------------------

    def locate(self, topic: str, partition: int, *, max_lag: int | None = None) -> Location:
        key = (topic, partition)
        if key in self._serving:
            return Local(partition, "active", self.lag.local(topic, partition), self.member_id)
        if max_lag is not None and key in self._standby_partitions():
            lag = self.lag.local(topic, partition, live=True)
            if lag is not None and lag <= max_lag:
                return Local(partition, "standby", lag, self.member_id)
        owner, standbys = self._routes.get(key, (None, []))
        if owner is not None and owner != self.settings.url:
            return Redirect(partition, owner)
        if max_lag is not None:
            for url, lag in standbys:
                if url != self.settings.url and lag is not None and lag <= max_lag:
                    return Redirect(partition, url)
        if key in self._restoring:
            return Unavailable(partition, "this instance is restoring it from the changelog")
        return Unavailable(partition, "no live owner yet: the cluster is rebalancing")

    # -- readiness -------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready when following an assignment, serving all of its partitions, caught up."""
        failure = self._failure or self.projections.failure()
        if failure:
            return False, {"reason": failure}
        if self._applied == 0:
            waited = time.monotonic() - self._started_at
            leader = min(self.map.members(), default=self.member_id)
            return False, {
                "reason": f"joining the cluster: no assignment after {waited:.0f}s "
                f"(the leader is the live member with the smallest id: {leader})"
            }
        with self._lock:
            restoring = sorted(self._restoring)
            serving = set(self._serving)
        if restoring:
            return False, {"reason": f"restoring {restoring}"}
        waiting = sorted(self.assigned() - serving)
        if waiting:
            return False, {"reason": f"waiting for other members to release {waiting}"}
        if self.commands is not None:
            events, taken = self.settings.events_topic, self.commands.owned()
            replaying = sorted(p for t, p in serving if t == events and p not in taken)
            if replaying:
                return False, {"reason": f"replaying partitions {replaying} for commands"}
        active = {f"{store}/{p}" for store, p in self._store_keys(serving)}
        lag = {k: v for k, v in self.lag.measure(serving).items() if k in active}
        unknown = unmeasured(active, lag)
        if unknown:
            return False, {"reason": f"end offsets not known yet for {unknown}", "lag": lag}
        return all(v == 0 for v in lag.values()), {"lag": lag, "instance": self.member_id}


def _by_topic(partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    owned: dict[str, list[int]] = {}
    for topic, p in sorted(partitions):
        owned.setdefault(topic, []).append(p)
    return owned


def _copy_lag(
    stores: Mapping[str, StoreLayout], state: MemberState, topic: str, partition: int
) -> int | None:
    """Records ``state``'s member lacks to serve ``partition``: 0 for a copy it serves, its
    standby copy's published lag, or None without a copy."""
    if partition in state.active.get(topic, ()):
        return 0
    if partition in state.standby.get(topic, ()):
        return partition_lag(state.lag, stores, topic, partition)
    return None
