"""One instance's part in its service's cluster.

The consumer group (:mod:`.membership`) decides which source partitions this instance owns.
For a gained partition the node takes over its stores (a warm standby copy, or the changelog
when there is none, only the missing tail being read), gives the command handler the partition
and starts the projection on it from the source offset the copy carries; only then does it
serve it. A lost partition stops being served and written before the group may move it. The
node publishes what it serves and how far behind each copy is (:mod:`.map`), keeps the standby
copies the map assigns it, and answers :meth:`locate` for the HTTP routes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from foldstream.changelog import StandbyReplicas, StoreLayout, restore
from foldstream.cluster.map import ClusterMap, MemberState
from foldstream.cluster.membership import GroupMembership, TopicPartitions
from foldstream.errors import PartitionFenced
from foldstream.offsets import EndOffsets, holds_records
from foldstream.query_api.stores import StoreReaders
from foldstream.routing import Local, Location, Redirect, Unavailable
from foldstream.settings import Settings

log = logging.getLogger(__name__)
PUBLISH_INTERVAL_S = 0.5


class PartitionWriters(Protocol):
    """What the node drives when ownership changes (the command handler)."""

    def assign(self, partitions: Iterable[int]) -> int: ...

    def revoke(self, partitions: Iterable[int]) -> None: ...

    def owned(self) -> frozenset[int]: ...


class Projections(Protocol):
    def run(self, owned: Mapping[str, Iterable[int]]) -> None: ...

    def failure(self) -> str | None: ...


class ClusterNode:
    """Ties membership, the cluster map, standby copies, projections and commands together.

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
        self.ends = dict(ends)
        self._serving: set[tuple[str, int]] = set()
        self._restoring: set[tuple[str, int]] = set()
        self._lag: dict[str, int] = {}
        self._empty_spans: dict[tuple[str, int], tuple[int, int]] = {}
        self._last_spans: dict[tuple[str, int], tuple[int, int]] = {}
        self._routes: dict[tuple[str, int], tuple[str | None, list[tuple[str, int | None]]]] = {}
        self._epoch = 0
        self._lock = threading.RLock()
        self._commands_lock = threading.Lock()
        self._gains: queue.Queue[TopicPartitions | None] = queue.Queue()
        self._stopping = threading.Event()
        self._failure: str | None = None
        self._started_at = time.monotonic()
        self.map = ClusterMap(
            bootstrap=settings.bootstrap_servers,
            topic=settings.cluster_topic,
            member_id=member_id,
            liveness_s=max(1.5, settings.session_timeout_ms / 1000 * 0.66),
            fetch_wait_max_ms=settings.fetch_wait_max_ms,
        )
        self.membership = GroupMembership(
            bootstrap=settings.bootstrap_servers,
            group=settings.group_id,
            topics=sorted(self.topics),
            client_id=member_id,
            on_assigned=self._gains.put,
            on_revoked=self._revoked,
            session_timeout_ms=settings.session_timeout_ms,
        )
        self._threads = [
            threading.Thread(target=self._take_over_loop, name="takeover", daemon=True),
            threading.Thread(target=self._publish_loop, name="cluster-publish", daemon=True),
        ]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, join_timeout: float = 60.0) -> None:
        """Join the group and wait for the first assignment (possibly empty)."""
        self.publish()
        for thread in self._threads:
            thread.start()
        self.membership.start()
        if not self.membership.wait_joined(join_timeout):
            log.warning("no assignment from group %s yet", self.settings.group_id)

    def close(self) -> None:
        """Stop serving, leave the group (partitions move at once), close everything."""
        with self._lock:
            self._serving.clear()
        self.map.leave()
        self._stopping.set()
        self._gains.put(None)
        self.membership.close()
        for thread in self._threads:
            thread.join(timeout=10)
        self.map.close()

    # -- ownership changes -----------------------------------------------------------------

    def _store_keys(self, partitions: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        return [
            (store, p)
            for topic, p in partitions
            for store, layout in self.stores.items()
            if layout.source_topic == topic
        ]

    def _owned_by_topic(self, partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
        owned: dict[str, list[int]] = {}
        for topic, p in sorted(partitions):
            owned.setdefault(topic, []).append(p)
        return owned

    def _revoked(self, lost: TopicPartitions) -> None:
        # Runs before the group may give the partitions to another member: stop everything that
        # writes them (the projection queries, the command handler) before returning.
        with self._lock:
            self._serving -= lost
            self._restoring -= lost
            serving = set(self._serving)
        self.publish()
        self.projections.run(self._owned_by_topic(serving))
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
            except Exception as exc:  # noqa: BLE001 - reported through /ready and the log
                log.exception("taking over %s failed", sorted(gained))
                self._failure = f"taking over {sorted(gained)} failed: {exc}"

    def _take_over(self, gained: TopicPartitions) -> None:
        with self._lock:
            self._restoring |= gained
            self._epoch = max(self._epoch, self.map.max_epoch()) + 1
        self.publish()
        started = time.monotonic()
        keys = self._store_keys(gained)
        self.replicas.release(keys)
        restored = 0
        for store, partition in keys:
            restored += restore(
                bootstrap=self.settings.bootstrap_servers,
                state_dir=self.settings.state_dir,
                store=store,
                layout=self.stores[store],
                partition=partition,
                fetch_wait_max_ms=self.settings.fetch_wait_max_ms,
            )
        with self._lock:
            still_owned = gained & self.membership.owned()
            self._restoring -= gained
            self._serving |= still_owned
            serving = set(self._serving)
        # Reads are served from the restored copies at once; the projection catches up after,
        # and commands wait (503) until the handler has replayed its partitions.
        self.publish()
        log.info(
            "serving %s after restoring %d changelog records in %.2fs",
            sorted(still_owned),
            restored,
            time.monotonic() - started,
        )
        self.projections.run(self._owned_by_topic(serving))
        if self.commands is not None:
            # Under the lock the revocation takes too: a partition revoked meanwhile is never
            # handed to the command handler (whose producer would fence the new owner's).
            with self._commands_lock:
                owned = self.membership.owned()
                events = [p for t, p in still_owned if t == self.settings.events_topic]
                events = [p for p in events if (self.settings.events_topic, p) in owned]
                if events:
                    self.commands.assign(events)

    # -- the cluster map -------------------------------------------------------------------

    def state(self) -> MemberState:
        with self._lock:
            serving, restoring = set(self._serving), set(self._restoring)
            epoch = self._epoch
        standby = {(t, p) for t, p in self._standby_partitions()}
        return MemberState(
            id=self.member_id,
            url=self.settings.url,
            epoch=epoch,
            active=self._owned_by_topic(serving),
            restoring=self._owned_by_topic(restoring),
            standby=self._owned_by_topic(standby),
            lag=dict(self._lag),
        )

    def publish(self) -> None:
        self.map.publish(self.state())

    def _standby_partitions(self) -> set[tuple[str, int]]:
        topic_of = {store: layout.source_topic for store, layout in self.stores.items()}
        return {(topic_of[store], p) for store, p in self.replicas.held()}

    def _publish_loop(self) -> None:
        while not self._stopping.wait(PUBLISH_INTERVAL_S):
            try:
                self._fence_superseded()
                self._keep_standbys()
                self._measure_lag()
                self.publish()
                self._build_routes()
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
        with self._lock:
            mine = self._serving | self._restoring | set(self.membership.owned())
        held = self._standby_partitions()
        wanted: set[tuple[str, int]] = set()
        for topic, count in self.topics.items():
            for p in range(count):
                if (topic, p) in mine:
                    continue
                placement = self.map.standby_placement(topic, p, self.settings.standby_replicas)
                # While a partition has no owner, keep its copy warm for whoever takes it.
                if (placement is None and (topic, p) in held) or (
                    placement is not None and self.member_id in placement
                ):
                    wanted.add((topic, p))
        self.replicas.assign(self._store_keys(wanted))

    def _measure_lag(self) -> None:
        lag: dict[str, int] = {}
        with self._lock:
            serving = set(self._serving)
        for store, layout in self.stores.items():
            try:
                ends = self.ends[layout.source_topic].ends(timeout=0.2)
            except Exception:  # noqa: BLE001 - ends not known yet: no lag to report
                ends = {}
            for topic, p in serving:
                if topic == layout.source_topic and p in ends:
                    lag[f"{store}/{p}"] = self._source_lag(
                        topic, p, self.readers.next_offset(store, p), ends[p]
                    )
        for store, p in self.replicas.held():
            standby_lag = self.replicas.lag(store, p)
            if standby_lag is not None:
                lag[f"{store}/{p}"] = standby_lag
        self._lag = lag

    def _source_lag(self, topic: str, partition: int, applied: int, end: int) -> int:
        """``end - applied``, or 0 when only offsets without records (transaction markers) lie
        between them; a span found empty is remembered until the offsets move.

        Probing the span costs a consumer, so it is done only for a span that did not move
        since the last measurement: a projection at work moves it on every batch.
        """
        span = (applied, end)
        if end <= applied or self._empty_spans.get((topic, partition)) == span:
            return 0
        last, self._last_spans[(topic, partition)] = self._last_spans.get((topic, partition)), span
        if last != span:
            return end - applied
        bootstrap = self.settings.bootstrap_servers
        if holds_records(bootstrap, topic, partition, applied, end, timeout=1.0):
            return end - applied
        self._empty_spans[(topic, partition)] = (applied, end)
        return 0

    def released(self, partition: int, error: Exception) -> None:
        """The command handler gave ``partition`` up after a failed transaction: fenced means
        another member writes it now (stop serving it here); otherwise take it over again."""
        key = (self.settings.events_topic, partition)
        if isinstance(error, PartitionFenced):
            log.error("partition %d: %s; dropping it", partition, error)
            threading.Thread(target=self._revoked, args=(frozenset({key}),), daemon=True).start()
        elif key in self.membership.owned():
            self._gains.put(frozenset({key}))

    def _build_routes(self) -> None:
        routes: dict[tuple[str, int], tuple[str | None, list[tuple[str, int | None]]]] = {}
        members = self.map.members()
        for topic, count in self.topics.items():
            for p in range(count):
                owner = self.map.active_owner(topic, p)
                standbys = [
                    (s.url, _partition_lag(s.lag, self.stores, topic, p))
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

    # -- routing ---------------------------------------------------------------------------

    def locate(self, topic: str, partition: int, *, max_lag: int | None = None) -> Location:
        key = (topic, partition)
        if key in self._serving:
            return Local(partition, "active", self._topic_lag(topic, partition), self.member_id)
        if max_lag is not None and key in self._standby_partitions():
            lag = self._topic_lag(topic, partition, live=True)
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

    def _topic_lag(self, topic: str, partition: int, *, live: bool = False) -> int | None:
        """This instance's lag on ``partition`` of ``topic`` as last measured, or with ``live``
        the standby copies' lag right now where they have one."""
        lag = self._lag
        if live:
            lag = dict(lag)
            for store, layout in self.stores.items():
                current = self.replicas.lag(store, partition)
                if layout.source_topic == topic and current is not None:
                    lag[f"{store}/{partition}"] = current
        return _partition_lag(lag, self.stores, topic, partition)

    # -- readiness -------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready when joined, nothing is being restored, and every active copy is caught up."""
        failure = self._failure or self.projections.failure()
        if failure:
            return False, {"reason": failure}
        if not self.membership.wait_joined(0):
            waited = time.monotonic() - self._started_at
            return False, {
                "reason": f"joining the cluster: no assignment from consumer group "
                f"{self.settings.group_id!r} after {waited:.0f}s"
            }
        with self._lock:
            restoring = sorted(self._restoring)
            serving = set(self._serving)
        if restoring:
            return False, {"reason": f"restoring {restoring}"}
        if self.commands is not None:
            events, taken = self.settings.events_topic, self.commands.owned()
            waiting = sorted(p for t, p in serving if t == events and p not in taken)
            if waiting:
                return False, {"reason": f"replaying partitions {waiting} for commands"}
        self._measure_lag()
        active = {f"{store}/{p}" for store, p in self._store_keys(serving)}
        lag = {k: v for k, v in self._lag.items() if k in active}
        return all(v == 0 for v in lag.values()), {"lag": lag, "instance": self.member_id}


def _partition_lag(
    lag: Mapping[str, int], stores: Mapping[str, StoreLayout], topic: str, partition: int
) -> int | None:
    """The largest lag (``lag`` maps ``"<store>/<partition>"``) among the stores of ``topic``
    at ``partition``; None unless every one of them has a figure."""
    lags = [
        lag.get(f"{store}/{partition}")
        for store, layout in stores.items()
        if layout.source_topic == topic
    ]
    if not lags or any(value is None for value in lags):
        return None
    return max(value for value in lags if value is not None)
