"""The partitions a member serves, and the rules for claiming and giving them up.

A partition (of a source topic) goes, on one member::

    (not held) --claim--> restoring --took_over--> serving
         ^                    |                       |
         +----- release ------+------- release -------+    (also: takeover_failed)

The rules that keep two members from ever writing one partition: a member claims what the
newest assignment gives it only once every other live member has *applied* that assignment (or
one that supersedes it: it released what it no longer owns) and claims none of those partitions;
it releases a partition as soon as the assignment no longer gives it, before saying it applied
that assignment. Each claim raises the member's epoch above every epoch it has seen (a Lamport
clock), which orders two claims of one partition. A failed takeover is claimed again after a
backoff, so no partition is left unowned by a failure.

This module holds the state and the rules only (no threads, no I/O): :mod:`.handover` drives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from foldstream.backoff import Backoff
from foldstream.cluster.assignment import Assignment, applied_at_least
from foldstream.cluster.records import MemberState

TopicPartition = tuple[str, int]
TopicPartitions = frozenset[TopicPartition]


@dataclass
class Ownership:
    """What ``member_id`` serves and restores, the assignment it applied, and its epoch."""

    member_id: str
    serving: set[TopicPartition] = field(default_factory=set)
    restoring: set[TopicPartition] = field(default_factory=set)
    #: ``(generation, leader)`` of the newest assignment whose releases are done.
    applied: tuple[int, str] = (0, "")
    epoch: int = 0
    _retry: dict[TopicPartition, Backoff] = field(default_factory=dict)

    def held(self) -> TopicPartitions:
        """Everything claimed: serving or restoring."""
        return frozenset(self.serving | self.restoring)

    def lost(self, assignment: Assignment) -> TopicPartitions:
        """What this member holds that ``assignment`` does not give it."""
        return self.held() - assignment.owned_by(self.member_id)

    def release(self, keys: Iterable[TopicPartition]) -> None:
        keys = set(keys)
        self.serving -= keys
        self.restoring -= keys

    def apply(self, assignment: Assignment) -> bool:
        """Record ``assignment`` as applied (call once :meth:`lost` is released); whether that
        changed what this member publishes."""
        if self.applied == assignment.identity:
            return False
        self.applied = assignment.identity
        return True

    def claimable(
        self, assignment: Assignment, members: Mapping[str, MemberState], now: float
    ) -> TopicPartitions:
        """What this member may claim now: given to it, not held, not waiting for a retry, and
        released by every other live member."""
        waiting = {key for key, backoff in self._retry.items() if not backoff.due(now)}
        wanted = assignment.owned_by(self.member_id) - self.held() - waiting
        if not wanted or self.applied != assignment.identity:
            return frozenset()
        for member_id, state in members.items():
            if member_id == self.member_id:
                continue
            if not applied_at_least(state.applied, assignment.identity):
                return frozenset()  # it may still be taking one of them over
            claimed = (state.active, state.restoring)
            if any(p in c.get(topic, ()) for topic, p in wanted for c in claimed):
                return frozenset()
        return wanted

    def claim(self, keys: TopicPartitions, newest_epoch: int) -> int:
        """Start restoring ``keys``, with an epoch above every one seen; returns it."""
        self.restoring |= keys
        self.epoch = max(self.epoch, newest_epoch) + 1
        return self.epoch

    def took_over(self, keys: TopicPartitions, epoch: int) -> TopicPartitions:
        """``keys`` are restored and held, their records written with ``epoch``: the ones still
        claimed (not released meanwhile) are served from now on; returns them."""
        still = keys & self.restoring
        self.restoring -= keys
        self.serving |= still
        self.epoch = max(self.epoch, epoch)
        for key in keys:
            self._retry.pop(key, None)
        return frozenset(still)

    def takeover_failed(self, keys: TopicPartitions, now: float) -> float:
        """Restoring ``keys`` failed: they are claimed again after a backoff; returns it."""
        self.restoring -= keys
        delays = [self._retry.setdefault(key, Backoff()).failed(now) for key in keys]
        return max(delays, default=0.0)

    def superseded(self, members: Mapping[str, MemberState]) -> TopicPartitions:
        """Partitions served here that another live member claims with a newer epoch: this
        member missed its own revocation (a long pause) and must not go on serving them."""
        return frozenset(
            (topic, p)
            for topic, p in self.serving
            for member_id, state in members.items()
            if member_id != self.member_id
            and p in state.active.get(topic, ())
            and state.epoch > self.epoch
        )


def by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """``{topic: [partition, ...]}`` of ``partitions``, sorted."""
    owned: dict[str, list[int]] = {}
    for topic, p in sorted(partitions):
        owned.setdefault(topic, []).append(p)
    return owned
