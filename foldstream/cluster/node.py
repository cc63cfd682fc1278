"""One instance's part in its service's cluster, put together from parts with one job each:

- membership (:mod:`.map`): the cluster topic read into a view of the live members and the
  newest assignment, and this member's heartbeat;
- leadership (:mod:`.leader`): the member with the smallest id plans and publishes assignments;
- ownership (:mod:`.ownership`, driven by :mod:`.handover`): releasing, claiming and taking over
  partitions, and keeping the projections and the command handler in line with them;
- standby copies (:mod:`.standbys`) and their lag (:mod:`.lag`);
- location and readiness (:mod:`.location`): what the HTTP routes ask.

The node only wires them, runs the periodic upkeep and publishes what this member serves.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, TypedDict

from foldstream.changelog import StandbyReplicas, StoreCatalog, StoreLayout, restore
from foldstream.cluster.handover import CommandPartitions, Handover, Projections
from foldstream.cluster.heartbeat import Heartbeat
from foldstream.cluster.lag import LagMeter, partition_lag
from foldstream.cluster.leader import Leader
from foldstream.cluster.location import Location
from foldstream.cluster.map import ClusterMap
from foldstream.cluster.ownership import Ownership, by_topic
from foldstream.cluster.peers import PeerWatch
from foldstream.cluster.rebuilds import Generations, Rebuilds
from foldstream.cluster.records import MemberState
from foldstream.cluster.standbys import StandbyKeeper
from foldstream.cluster.version_cleanup import RetiredTopics
from foldstream.cluster.versions import VersionSwitch
from foldstream.end_probes import ProbedEnds
from foldstream.routing import Location as Answer
from foldstream.routing import MaxLag
from foldstream.settings import Settings
from foldstream.state.local import LocalStores

log = logging.getLogger(__name__)
UPKEEP_INTERVAL_S = 0.5


class ClusterFigures(TypedDict):
    """What a member says of itself in ``GET /metrics``."""

    invalid_records: int  # records of the cluster topic ignored as invalid
    suspicions: int  # members that turned suspect in this member's view, ever
    suspects: int  # members that are suspects now
    view_current: bool  # whether this member's own heartbeats are read back in time
    roles: Mapping[tuple[str, int], str]  # (topic, partition) -> active, restoring or standby
    lag: Mapping[str, int]  # "<store>/<partition>" -> records behind


class ClusterNode:
    """This member of the cluster. ``stores`` maps each store to its source and changelog
    topics (a :class:`StoreCatalog` that gains the rebuild generations ``generations`` adds,
    :mod:`.rebuilds`), ``topics`` each source topic to its partition count; ``store_info`` is
    what ``GET /cluster`` says of each store."""

    def __init__(
        self,
        *,
        settings: Settings,
        member_id: str,
        stores: Mapping[str, StoreLayout],
        topics: Mapping[str, int],
        store_info: Mapping[str, dict[str, Any]],
        local: LocalStores,
        replicas: StandbyReplicas,
        projections: Projections,
        commands: CommandPartitions | None,
        ends: Mapping[str, ProbedEnds],
        generations: Generations | None = None,
    ) -> None:
        self.settings = settings
        stores = self.catalog = stores if isinstance(stores, StoreCatalog) else StoreCatalog(stores)
        self.member_id = member_id
        self.replicas = replicas
        self._stopping = threading.Event()
        self.versions = VersionSwitch(
            stores=stores,
            topics=topics,
            ready_max_lag=settings.ready_max_lag,
            state_dir=settings.state_dir,
            hold_s=settings.session_timeout_ms / 1000,
        )
        self._retired_topics = RetiredTopics(settings)
        self.map = ClusterMap(
            bootstrap=settings.bootstrap_servers,
            topic=settings.cluster_topic,
            member_id=member_id,
            liveness_s=settings.session_timeout_ms / 1000,
            suspect_s=settings.suspect_after_ms / 1000,
            on_change=self._changed,
            fetch_wait_max_ms=settings.background_fetch_wait_max_ms,
        )
        self.peers = PeerWatch(
            own_url=settings.url,
            urls=lambda: [member.url for member in self.map.members().values()],
            on_change=self._changed,
        )
        copies_lock = self._copies_lock = threading.Lock()
        self.handover = Handover(
            ownership=Ownership(member_id),
            cluster_map=self.map,
            stores=stores,
            versions=self.versions,
            local=local,
            copies=replicas,
            copies_lock=copies_lock,
            restore=functools.partial(self._restore, stores),
            projections=projections,
            commands=commands,
            events_topic=settings.events_topic,
            publish=self.publish,
        )
        self.rebuilds = Rebuilds(
            state_dir=settings.state_dir,
            catalog=stores,
            versions=self.versions,
            hold_added=self.handover.hold_added,
            cluster_map=self.map,
            generations=generations,
        )
        self.standbys = StandbyKeeper(
            cluster_map=self.map, handover=self.handover, replicas=replicas, copies_lock=copies_lock
        )
        self.lag = LagMeter(
            bootstrap=settings.bootstrap_servers,
            stores=stores,
            local=local,
            replicas=replicas,
            ends=ends,
            versions=self.versions,
        )
        self.location = self._location(topics, store_info, projections, commands)
        self.leader = self._leader(topics)
        self.heartbeat = Heartbeat(self.map, self.state, on_pause=self._paused)
        self._upkeep = threading.Thread(
            target=self._upkeep_loop, name="cluster-upkeep", daemon=True
        )
        # Its own thread: retiring a version waits for a query to stop and for the broker.
        self._versions_upkeep = threading.Thread(
            target=self._versions_loop, name="store-versions", daemon=True
        )

    def _location(
        self,
        topics: Mapping[str, int],
        store_info: Mapping[str, dict[str, Any]],
        projections: Projections,
        commands: CommandPartitions | None,
    ) -> Location:
        """Where each partition is answered, and whether this member is ready."""
        settings = self.settings
        return Location(
            cluster_map=self.map,
            peers=self.peers,
            handover=self.handover,
            standbys=self.standbys,
            lag=self.lag,
            url=settings.url,
            topics=topics,
            store_info=store_info,
            projections=projections,
            commands=commands,
            events_topic=settings.events_topic,
            ready_max_lag=settings.ready_max_lag,
        )

    def _leader(self, topics: Mapping[str, int]) -> Leader:
        """The role this member plays while it leads: planning and publishing assignments."""
        settings = self.settings
        return Leader(
            bootstrap=settings.bootstrap_servers,
            transactional_id=f"{settings.cluster_topic}.leader",
            cluster_map=self.map,
            topics=topics,
            standby_replicas=settings.standby_replicas,
            copy_lag=lambda state, topic, p: _copy_lag(self.lag.counted(), state, topic, p),
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, join_timeout: float = 60.0) -> None:
        """Announce this member and wait until it follows an assignment (possibly empty)."""
        log.info("member %s at %s joining the cluster", self.member_id, self.settings.url)
        self.map.start()
        self.publish()
        self.heartbeat.start()
        self.peers.start()
        self.leader.start()
        self.handover.start()
        self._upkeep.start()
        self._versions_upkeep.start()
        deadline = time.monotonic() + join_timeout
        while self.handover.ownership.applied[0] == 0 and time.monotonic() < deadline:
            self.handover.wake.wait(0.05)
        if self.handover.ownership.applied[0] == 0:
            log.warning("no assignment yet after %.0fs", join_timeout)

    def close(self) -> None:
        """Stop writing and serving, then leave (the others take the partitions at once)."""
        self._stopping.set()
        self.leader.stop()
        self.handover.stop()
        self._upkeep.join(timeout=10)
        self._versions_upkeep.join(timeout=10)
        self.heartbeat.stop()
        self.peers.stop()
        self.map.leave()
        self.map.close()

    # -- what the routes ask -----------------------------------------------------------------

    def locate(self, topic: str, partition: int, *, max_lag: MaxLag = None) -> Answer:
        return self.location.locate(topic, partition, max_lag=max_lag)

    def readiness(self) -> tuple[bool, dict[str, object]]:
        return self.location.readiness()

    def snapshot(self) -> dict[str, Any]:
        return self.location.snapshot()

    def figures(self) -> ClusterFigures:
        """What ``GET /metrics`` says of this member."""
        # Outside the handover's lock: the standby copies' lock can be held for seconds (a
        # copy opened, a batch applied), and the heartbeat takes the handover's lock.
        roles = dict.fromkeys(self.standbys.partitions(), "standby")
        with self.handover.lock:
            ownership = self.handover.ownership
            roles.update(dict.fromkeys(ownership.restoring, "restoring"))
            roles.update(dict.fromkeys(ownership.serving, "active"))
        invalid = self.map.invalid_records + self.rebuilds.invalid
        return {
            "invalid_records": invalid,
            "suspicions": self.map.suspicion.suspicions + self.peers.losses,
            "suspects": len(self.location.suspects()),
            "view_current": self.map.view_is_current(),
            "roles": roles,
            "lag": self.lag.last,
        }

    # -- the member's state ------------------------------------------------------------------

    def state(self) -> MemberState:
        with self.handover.lock:
            ownership = self.handover.ownership
            serving, restoring = set(ownership.serving), set(ownership.restoring)
            epoch, (generation, leader) = ownership.epoch, ownership.applied
        serving_versions, serving_generations = self.versions.published()
        return MemberState(
            id=self.member_id,
            url=self.settings.url,
            epoch=epoch,
            generation=generation,
            leader=leader,
            active=by_topic(serving),
            restoring=by_topic(restoring),
            standby=by_topic(self.standbys.partitions()),
            lag=dict(self.lag.last),
            serving=serving_versions,
            retired=sorted(self.versions.retired()),
            generations=serving_generations,
        )

    def publish(self) -> None:
        self.map.publish(self.state())

    def _changed(self) -> None:
        # On every change of the map: in a failover, lookups go to a partition's new owner as
        # soon as it claims the partition; queries switch to a store's new version as soon as
        # it is live.
        try:
            self.versions.update(self.map.members(), self.map.assignment())
        finally:
            self.location.build_routes()
        self.handover.wake.set()

    def _paused(self, paused_s: float) -> None:
        """This process stood still for longer than the session timeout: the others may have
        taken its partitions over meanwhile. Give them all up at once (from another thread: the
        heartbeat must go on); the ones still assigned here are claimed again, restored and
        written with a new epoch."""
        held = self.handover.held()
        if held:
            log.warning(
                "this instance stood still for %.1fs, longer than the session timeout: giving up "
                "%s",
                paused_s,
                sorted(held),
            )
            with self.handover.lock:  # at once: a takeover ending now serves none of them
                self.handover.ownership.release(held)
            threading.Thread(target=self.handover.give_up, args=(held,), daemon=True).start()

    def _upkeep_loop(self) -> None:
        while not self._stopping.wait(UPKEEP_INTERVAL_S):
            try:
                self._fence_superseded()
                self.standbys.keep()
                with self.handover.lock:
                    serving = set(self.handover.ownership.serving)
                self.lag.measure(serving)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("cluster upkeep failed")

    def _versions_loop(self) -> None:
        while not self._stopping.wait(UPKEEP_INTERVAL_S):
            try:
                self._keep_versions()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("store versions upkeep failed")

    def _keep_versions(self) -> None:
        """Retire the store versions every member has switched away from, delete what is left
        of retired ones here, and (the leader) their topics once every member retired them;
        add the rebuild generations requested (:mod:`.rebuilds`)."""
        self.rebuilds.follow()
        members = self.map.members()
        ends = {}
        for topic, topic_ends in self.lag.ends.items():
            try:
                ends[topic] = topic_ends.ends(timeout=0)
            except Exception:  # noqa: BLE001 - not known yet: no progress to give
                continue
        due = self.versions.update(members, self.map.assignment(), ends)
        for store in due:
            # Its query first (or, in a query shared with other stores, its tasks refused):
            # nothing writes the copies the next sync releases.
            self.handover.projections.retire(store)
            self.versions.marks.retire(store)
        if due:
            self.handover.sync()  # releases the retired versions' active copies
            self.standbys.keep()  # and their standby copies
            self.publish()
        with self._copies_lock:  # no copy is opened meanwhile
            busy = self.replicas.held() | self.handover.local.held()
            self.versions.marks.delete_directories(busy | self.handover.taking_over())
        if self.leader.leading:
            self._retired_topics.delete(members, self.versions.retired())

    def _fence_superseded(self) -> None:
        # A member that missed its own revocation (a long pause) must not go on serving: when
        # a live member claims one of our partitions with a newer epoch, drop it here too.
        with self.handover.lock:
            superseded = self.handover.ownership.superseded(self.map.members())
        if superseded:
            log.warning("%s now served by a newer owner: dropping them", sorted(superseded))
            self.handover.give_up(superseded)

    def _restore(self, stores: Mapping[str, StoreLayout], store: str, partition: int) -> int:
        return restore(
            bootstrap=self.settings.bootstrap_servers,
            state_dir=self.settings.state_dir,
            store=store,
            layout=stores[store],
            partition=partition,
            fetch_wait_max_ms=self.settings.fetch_wait_max_ms,
        )


def _copy_lag(
    stores: Mapping[str, StoreLayout], state: MemberState, topic: str, partition: int
) -> int | None:
    """Records ``state``'s member lacks to serve ``partition``: 0 for a copy it serves, its
    standby copy's published lag, or None without a copy; 0 for a topic no store reads (the
    events of a service whose stores read other topics): there is nothing to copy."""
    if partition in state.active.get(topic, ()):
        return 0
    if all(layout.source_topic != topic for layout in stores.values()):
        return 0
    if partition in state.standby.get(topic, ()):
        return partition_lag(state.lag, stores, topic, partition)
    return None
