"""Leadership: the live member with the smallest id plans the assignment and publishes it.

The leader publishes through a transactional producer whose ``transactional.id`` names the
role (``<service>.cluster.leader``): taking the role calls ``init_transactions``, which fences
every producer that held it before, so a member that led before a long pause cannot publish
once another has taken the role, whatever it believes. After taking the role the leader waits
until its view of the topic covers everything appended before (one of its heartbeats read
back): it plans on top of the newest assignment, one a fenced leader wrote included, with a
generation above it.

A member starts leading only once it has read the topic for a join window: instances started
together see each other first and agree on one first assignment. With other members in view it
also waits out the session timeout, so that the records of members that died before it started
have expired from its view.

The plan (:func:`~foldstream.cluster.assignment.plan`) is a pure function of the members, the
previous assignment and the copies' lag, so planning again on an unchanged cluster publishes
nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Producer

from foldstream.backoff import Backoff
from foldstream.cluster.assignment import Assignment, plan
from foldstream.cluster.map import ASSIGNMENT_KEY, ClusterMap
from foldstream.cluster.records import MemberState
from foldstream.kafka import producer_config

log = logging.getLogger(__name__)
#: How often a member that is not the leader says whom it leaves the role to.
DEFER_LOG_EVERY_S = 30.0

#: ``(member's state, topic, partition) -> records its copy lacks`` (None: no copy).
CopyLag = Callable[[MemberState, str, int], "int | None"]


class Leader:
    """Leads ``cluster_map``'s members while this one (``member_id``) is the leader."""

    def __init__(
        self,
        *,
        bootstrap: str,
        transactional_id: str,
        cluster_map: ClusterMap,
        topics: Mapping[str, int],
        standby_replicas: int,
        copy_lag: CopyLag,
        join_window_s: float = 1.0,
        tick_s: float = 0.1,
        transaction_timeout_s: float = 10.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.transactional_id = transactional_id
        self._map = cluster_map
        self.topics = dict(topics)
        self.standby_replicas = standby_replicas
        self._copy_lag = copy_lag
        self.join_window_s = join_window_s
        self.tick_s = tick_s
        self.transaction_timeout_s = transaction_timeout_s
        self._producer: Any = None
        self._took_role_at = 0.0
        self._deferred_logged_at = -DEFER_LOG_EVERY_S
        self._backoff = Backoff()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cluster-leader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        self._step_down()

    @property
    def leading(self) -> bool:
        return self._producer is not None

    def _run(self) -> None:
        while not self._stopping.wait(self.tick_s):
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("leading the cluster failed")

    def step(self) -> None:
        """One round: take or give up the role, plan, publish what changed."""
        members = self._map.members()
        if not self._eligible(members):
            self._step_down()
            return
        if not self._holds_role():
            return
        current = self._map.assignment()
        planned = plan(
            self.topics,
            members,
            current,
            standby_replicas=self.standby_replicas,
            copy_lag=lambda member, topic, p: self._copy_lag(members[member], topic, p),
        )
        if current.generation and current.same_plan(planned) and current.members == sorted(members):
            return
        new = Assignment(current.generation + 1, self._map.member_id, *planned, sorted(members))
        if self._publish(new):
            log.info(
                "assignment generation %d for %s: active %s, standby %s, warming up %s",
                new.generation,
                sorted(members),
                new.active,
                new.standby,
                new.warmups,
            )

    def _eligible(self, members: Mapping[str, MemberState]) -> bool:
        cluster_map = self._map
        if not cluster_map.caught_up():
            return False
        smallest = min(members, default=None)
        if smallest != cluster_map.member_id:
            self._defer_to(smallest)
            return False
        settled_for = cluster_map.caught_up_for()
        if settled_for < self.join_window_s:
            return False
        return len(members) == 1 or settled_for >= cluster_map.liveness_s

    def _defer_to(self, member: str | None) -> None:
        """Say, now and then, which live member this one leaves the role to: a member that
        stays live in the view without leading is what leaves a cluster without assignment."""
        now = time.monotonic()
        if now - self._deferred_logged_at >= DEFER_LOG_EVERY_S:
            self._deferred_logged_at = now
            log.info("%s leaves the leader's role to %s", self._map.member_id, member)

    def _holds_role(self) -> bool:
        """Take the role if not held (fencing earlier holders); True once the view covers
        everything appended before it was taken."""
        if self._producer is None:
            now = time.monotonic()
            if not self._backoff.due(now):
                return False
            producer = Producer(
                producer_config(
                    self.bootstrap, linger_ms=0, **{"transactional.id": self.transactional_id}
                )
            )
            try:
                producer.init_transactions(self.transaction_timeout_s)
            except Exception as exc:  # noqa: BLE001 - tried again after the backoff
                delay = self._backoff.failed(time.monotonic())
                log.warning("could not take the leader's role (%s); again in %.1fs", exc, delay)
                return False
            self._producer, self._took_role_at = producer, time.monotonic()
            log.info("%s leads the cluster", self._map.member_id)
        return self._map.view_at() > self._took_role_at

    def _publish(self, assignment: Assignment) -> bool:
        producer = self._producer
        try:
            producer.begin_transaction()
            producer.produce(self._map.topic, key=ASSIGNMENT_KEY, value=assignment.to_json())
            producer.commit_transaction(self.transaction_timeout_s)
        except Exception as exc:  # noqa: BLE001 - fenced by a newer leader, or the broker failed
            delay = self._backoff.failed(time.monotonic())
            log.warning(
                "publishing assignment generation %d failed (%s); leading again in %.1fs if "
                "still the leader",
                assignment.generation,
                exc,
                delay,
            )
            self._producer = None  # init_transactions of the next holder aborts what is left
            return False
        self._backoff.reset()
        self._map.adopt(assignment)
        return True

    def _step_down(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            log.info("%s no longer leads the cluster", self._map.member_id)
            try:
                producer.flush(1)
            except Exception:  # noqa: BLE001 - it is dropped either way
                log.debug("flushing the leader's producer failed", exc_info=True)
