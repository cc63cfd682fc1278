"""Where each partition is answered, and whether this member is ready: what the HTTP routes ask.

:meth:`Location.locate` says where a request for a partition goes: here (the active copy, or a
standby copy within the client's ``max_lag``), to another member (a redirect), or nowhere right
now (503). No request is sent to a suspect (a member whose heartbeats are late: :mod:`.suspects`).
While this member's own view of the cluster is not current (none of its heartbeats read back
within the session timeout) it cannot tell who owns what: it answers reads only from a copy of
unknown lag where the request allows any (``max_lag=any``), and nothing else (503).
:meth:`Location.readiness` says whether a load balancer should send this member traffic: its view
is current, it serves everything the assignment gives it, its command partitions are replayed, no
move of its partitions is pending, and every copy it serves is within ``ready_max_lag`` records
of its source.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from foldstream.cluster.handover import CommandPartitions, Handover, Projections
from foldstream.cluster.lag import LagMeter, partition_lag, unmeasured
from foldstream.cluster.map import ClusterMap
from foldstream.cluster.ownership import TopicPartition
from foldstream.cluster.peers import PeerWatch
from foldstream.cluster.standbys import StandbyKeeper
from foldstream.routing import ANY_LAG, Local, MaxLag, Redirect, Unavailable, within
from foldstream.routing import Location as Answer


class Copy(NamedTuple):
    """A standby copy of a partition: its member's URL, its lag (None: not known), and whether
    its member is a suspect (then no request is sent there)."""

    url: str
    lag: int | None
    suspect: bool


class Route(NamedTuple):
    """Where a partition's requests go: ``active``, the owner's URL (None: no owner requests may
    be sent to); ``suspect``, the owner's URL while it is a suspect; its standby copies, their
    lag behind the log (:func:`behind_log`); ``owner_lag``, the owner's lag as it last published
    it (None: no owner, or not published)."""

    active: str | None
    suspect: str | None
    standbys: tuple[Copy, ...]
    owner_lag: int | None = None


NO_ROUTE = Route(None, None, ())


def behind_log(copy_lag: int | None, owner_lag: int | None) -> int | None:
    """A standby copy's lag behind its source: its changelog records not yet applied plus the
    source records its owner had not folded when it last published its lag. The changelog
    alone measures the copy against the owner's store, which may itself trail the log: a copy
    with no changelog record to apply reported 0 while the events of acknowledged commands were
    still unfolded (a read with ``max_lag=0`` then missed them)."""
    if copy_lag is None or owner_lag is None:
        return None
    return copy_lag + owner_lag


Routes = dict[TopicPartition, Route]
CUT_OFF = (
    "this instance's view of the cluster is not current (none of its heartbeats was read back "
    "within the session timeout: the broker is unreachable or slow), so it cannot tell who owns "
    "the partition now"
)


class Location:
    """Answers :meth:`locate` and :meth:`readiness` from the cluster map and local state."""

    def __init__(
        self,
        *,
        cluster_map: ClusterMap,
        peers: PeerWatch,
        handover: Handover,
        standbys: StandbyKeeper,
        lag: LagMeter,
        url: str,
        topics: Mapping[str, int],
        store_info: Mapping[str, dict[str, Any]],
        projections: Projections,
        commands: CommandPartitions | None,
        events_topic: str,
        ready_max_lag: int,
    ) -> None:
        self._map = cluster_map
        self._peers = peers
        self._handover = handover
        self._standbys = standbys
        self.lag = lag
        self.url = url
        self.topics = dict(topics)
        self.store_info = dict(store_info)
        self._projections = projections
        self._commands = commands
        self.events_topic = events_topic
        self.ready_max_lag = ready_max_lag
        self._routes: Routes = {}
        self._building = threading.Lock()
        self._started_at = time.monotonic()

    # -- routing -----------------------------------------------------------------------------

    def build_routes(self) -> None:
        """Recompute each partition's owner and standbys from the map (on every change, from
        the map's thread or the peer watch's: one at a time, so an older computation never
        replaces a newer one)."""
        with self._building:
            self._routes = self._computed_routes()

    def _computed_routes(self) -> Routes:
        routes: Routes = {}
        members = self._map.members()
        suspects = self.suspects()
        counted = self.lag.counted()
        for topic, count in self.topics.items():
            for p in range(count):
                owner = self._map.active_owner(topic, p)
                owner_lag = None if owner is None else partition_lag(owner.lag, counted, topic, p)
                standbys = tuple(
                    Copy(
                        s.url,
                        behind_log(partition_lag(s.lag, counted, topic, p), owner_lag),
                        s.id in suspects,
                    )
                    for s in members.values()
                    if p in s.standby.get(topic, ()) and s is not owner
                )
                if owner is None:
                    routes[(topic, p)] = Route(None, None, standbys)
                elif owner.id in suspects:
                    routes[(topic, p)] = Route(None, owner.url, standbys, owner_lag)
                else:
                    routes[(topic, p)] = Route(owner.url, None, standbys, owner_lag)
        return routes

    def locate(self, topic: str, partition: int, *, max_lag: MaxLag = None) -> Answer:
        key = (topic, partition)
        if not self._map.view_is_current():
            return self._cut_off(key, max_lag)
        member_id = self._map.member_id
        ownership = self._handover.ownership
        if key in ownership.serving:
            return Local(partition, "active", self.lag.local(topic, partition), member_id)
        route = self._routes.get(key, NO_ROUTE)
        if max_lag is not None and key in self._standbys.partitions():
            lag = behind_log(self.lag.local(topic, partition, live=True), route.owner_lag)
            if within(lag, max_lag):
                return Local(partition, "standby", lag, member_id)
        gone = self._peers.gone  # asked at once: the routes follow a moment later
        if route.active is not None and route.active != self.url:
            if not gone(route.active):
                return Redirect(partition, route.active)
            route = Route(None, route.active, route.standbys, route.owner_lag)
        if max_lag is not None:
            for copy in route.standbys:
                if (
                    copy.url != self.url
                    and not copy.suspect
                    and within(copy.lag, max_lag)
                    and not gone(copy.url)
                ):
                    return Redirect(partition, copy.url)
        if key in ownership.restoring:
            return Unavailable(partition, "this instance is restoring it from the changelog")
        if route.suspect is not None:
            return Unavailable(
                partition,
                f"its owner {route.suspect} is a suspect (its heartbeats are late, or its "
                "connection closed: it may be dead); ask again, or allow a standby copy's lag "
                "with max_lag",
            )
        return Unavailable(partition, "no live owner yet: the cluster is rebalancing")

    def suspects(self) -> frozenset[str]:
        """The ids of the members no request is sent to: their heartbeats are late, or their
        connection closed (:mod:`.peers`)."""
        gone = self._peers.gone_urls()
        late = self._map.suspects()
        return late | {m.id for m in self._map.members().values() if m.url in gone}

    def _cut_off(self, key: TopicPartition, max_lag: MaxLag) -> Answer:
        """Where a request goes while this member's view is not current: only to a local copy,
        of unknown lag, when the request allows any."""
        partition = key[1]
        if max_lag == ANY_LAG:
            if key in self._handover.ownership.serving:
                return Local(partition, "unconfirmed", None, self._map.member_id)
            if key in self._standbys.partitions():
                return Local(partition, "standby", None, self._map.member_id)
        return Unavailable(
            partition,
            f"{CUT_OFF}; ask again, or read with max_lag={ANY_LAG} to accept a copy of unknown lag",
        )

    # -- readiness ---------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Whether this member serves what it is assigned, caught up (see the module)."""
        reason = self._unready_reason()
        if reason is not None:
            return False, {"reason": reason, "instance": self._map.member_id}
        serving = set(self._handover.ownership.serving)
        counts = self._handover.versions.counts  # a version being built is not waited for
        active = {f"{s}/{p}" for s, p in self._handover.store_keys(serving) if counts(s)}
        lag = {k: v for k, v in self.lag.measure(serving).items() if k in active}
        unknown = unmeasured(active, lag)
        if unknown:
            return False, {"reason": f"end offsets not known yet for {unknown}", "lag": lag}
        behind = sorted(k for k, v in lag.items() if v > self.ready_max_lag)
        if behind:
            return False, {
                "reason": f"{behind} are more than {self.ready_max_lag} records behind",
                "lag": lag,
                "instance": self._map.member_id,
            }
        return True, {"lag": lag, "instance": self._map.member_id}

    def _unready_reason(self) -> str | None:
        if not self._map.view_is_current():
            return CUT_OFF
        counts = self._handover.versions.counts  # a version being built does not count
        failure = self._handover.failure() or self._projections.failure(counts)
        if failure:
            return failure
        assignment = self._map.assignment()
        ownership = self._handover.ownership
        me = self._map.member_id
        if ownership.applied[0] == 0 or me not in assignment.members:
            # An assignment made without this member (one of an earlier run, read from the
            # topic) gives it nothing: it is not ready until the leader has counted it in.
            waited = time.monotonic() - self._started_at
            leader = min(self._map.members(), default=me)
            made = "no assignment" if ownership.applied[0] == 0 else "no assignment with it"
            return (
                f"joining the cluster: {made} after {waited:.0f}s "
                f"(the leader is the live member with the smallest id: {leader})"
            )
        restoring = sorted(ownership.restoring)
        if restoring:
            return f"restoring {restoring}"
        serving = set(ownership.serving)
        waiting = sorted(assignment.owned_by(self._map.member_id) - serving)
        if waiting:
            return f"waiting for other members to release {waiting}"
        moves = self._pending_moves()
        if moves:
            return f"partitions {moves} move once their new owner's copy has caught up"
        if self._commands is not None:
            taken = self._commands.owned()
            replaying = sorted(p for t, p in serving if t == self.events_topic and p not in taken)
            if replaying:
                return f"replaying partitions {replaying} for commands"
        return None

    def _pending_moves(self) -> list[TopicPartition]:
        """Partitions of this member, or warming up here, that the leader plans to move."""
        me = self._map.member_id
        assignment = self._map.assignment()
        return sorted(
            (topic, int(p))
            for topic, warmups in assignment.warmups.items()
            for p, member in warmups.items()
            if member == me or assignment.owner(topic, int(p)) == me
        )

    # -- the map for clients -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """``GET /cluster``: members, and each partition's active and standby URLs with lag."""
        self.build_routes()
        partitions: dict[str, dict[str, Any]] = {}
        for (topic, p), route in sorted(self._routes.items()):
            partitions.setdefault(topic, {})[str(p)] = {
                "active": route.active,
                "suspect": route.suspect,
                "standbys": [copy._asdict() for copy in route.standbys],
            }
        cluster = self._map.snapshot()
        suspects = self.suspects()
        for member in cluster["instances"]:
            member["suspect"] = member["id"] in suspects
        snapshot = {
            **cluster,
            "settled": self._settled(),
            "partitions": partitions,
            "stores": self.store_info,
        }
        if self._commands is not None:  # where a client sends each aggregate's commands
            topic = self.events_topic
            retention = self._commands.idempotency_retention_s()
            snapshot["commands"] = {
                "topic": topic,
                "partitions": self.topics[topic],
                # Clients resend a command of unknown outcome with its key only when this is
                # given: an instance that ignored the header could apply it twice.
                "idempotency_retention_s": retention,
            }
        return snapshot

    def _settled(self) -> bool:
        """Whether the assignment was planned for the live members and every partition is
        served by the owner it names, with no move waiting for a warm-up."""
        assignment = self._map.assignment()
        if assignment.generation == 0 or any(assignment.warmups.values()):
            return False
        if self.suspects():
            return False  # a member may be dead: the leader plans without it after the timeout
        members = self._map.members()
        if assignment.members != sorted(members):
            return False  # the leader has yet to plan for a member that joined or left
        for (topic, p), route in self._routes.items():
            owner = assignment.owner(topic, p)
            state = members.get(owner) if owner is not None else None
            if state is None or route.active != state.url:
                return False  # no owner, or a suspect one
        return True
