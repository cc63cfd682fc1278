"""Which instance owns each partition and which keep standby copies of it.

One member, the live member with the smallest id, plans the assignment and publishes it on the
cluster topic; every member follows the newest one it has read. The plan is what Kafka's own
group protocol cannot give through librdkafka (which has no pluggable assignor):

- **sticky**: a partition stays with its live owner;
- **standby-aware**: an orphaned partition goes to the live member with the most caught-up copy;
- **no downtime on join**: to balance load, a partition moves only to a member whose copy is
  caught up (within ``ACCEPTABLE_RECOVERY_LAG``, Kafka Streams' default); a member without one
  is first given the partition as a standby ("warm-up") and takes it over once it has caught up.

The plan is a pure function of the members, the previous assignment and the copies' lag, so
planning again on an unchanged cluster gives the same assignment (nothing is republished).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

#: Changelog records a copy may lack and still be given its partition to balance load.
ACCEPTABLE_RECOVERY_LAG = 10_000

#: ``(member, topic, partition) -> records the member's copy lacks``, None without a copy.
CopyLag = Callable[[str, str, int], "int | None"]

Partitions = dict[str, dict[str, str]]  # topic -> {partition (as str): member}
Standbys = dict[str, dict[str, list[str]]]  # topic -> {partition (as str): [members]}
Plan = tuple[Partitions, Standbys, Partitions]  # active, standby, warm-ups


@dataclass(frozen=True)
class Assignment:
    """One generation of the cluster's assignment, as published by its ``leader``."""

    generation: int = 0
    leader: str = ""
    active: Partitions = field(default_factory=dict)
    standby: Standbys = field(default_factory=dict)
    #: Moves waiting for their new owner's copy to catch up (it is among the standbys).
    warmups: Partitions = field(default_factory=dict)
    #: The live members it was planned for: a member joining or leaving calls for a new plan.
    members: list[str] = field(default_factory=list)

    def owner(self, topic: str, partition: int) -> str | None:
        return self.active.get(topic, {}).get(str(partition))

    def standbys(self, topic: str, partition: int) -> list[str]:
        return list(self.standby.get(topic, {}).get(str(partition), ()))

    def owned_by(self, member: str) -> frozenset[tuple[str, int]]:
        """``(topic, partition)`` pairs whose active owner is ``member``."""
        return frozenset(
            (topic, int(p))
            for topic, owners in self.active.items()
            for p, owner in owners.items()
            if owner == member
        )

    def standby_of(self, member: str) -> frozenset[tuple[str, int]]:
        """``(topic, partition)`` pairs of which ``member`` should keep a standby copy."""
        return frozenset(
            (topic, int(p))
            for topic, standbys in self.standby.items()
            for p, members in standbys.items()
            if member in members
        )

    def supersedes(self, other: Assignment) -> bool:
        """Newer generation wins; of two leaders' plans for one generation, the smaller id's."""
        return (self.generation, other.leader) > (other.generation, self.leader)

    def same_plan(self, planned: Plan) -> bool:
        return (self.active, self.standby, self.warmups) == planned

    @property
    def identity(self) -> tuple[int, str]:
        """``(generation, leader)``: two leaders' plans of one generation are different plans."""
        return self.generation, self.leader

    def to_json(self) -> bytes:
        """The record's value (read with :func:`~foldstream.cluster.records.parse_assignment`)."""
        return json.dumps(asdict(self), sort_keys=True).encode()


def applied_at_least(applied: tuple[int, str], target: tuple[int, str]) -> bool:
    """Whether a member that applied the assignment ``applied`` (``(generation, leader)``) has
    applied ``target`` or one that supersedes it (see :meth:`Assignment.supersedes`)."""
    (generation, leader), (target_generation, target_leader) = applied, target
    return (generation, target_leader) >= (target_generation, leader)


def plan(
    topics: Mapping[str, int],
    members: Iterable[str],
    previous: Assignment,
    *,
    standby_replicas: int,
    copy_lag: CopyLag,
) -> Plan:
    """The active owner, the standby members and the pending warm-up of every partition."""
    ring = sorted(set(members))
    active: Partitions = {}
    standby: Standbys = {}
    warming: Partitions = {}
    if not ring:
        return active, standby, warming
    for topic, count in sorted(topics.items()):
        owners, warmups = _plan_owners(topic, count, ring, previous, copy_lag)
        active[topic] = {str(p): owner for p, owner in sorted(owners.items())}
        standby[topic] = _plan_standbys(
            topic, owners, warmups, ring, previous, standby_replicas, copy_lag
        )
        warming[topic] = {str(p): member for p, member in sorted(warmups.items())}
    return active, standby, warming


def _plan_owners(
    topic: str, count: int, ring: Sequence[str], previous: Assignment, copy_lag: CopyLag
) -> tuple[dict[int, str], dict[int, str]]:
    """Owners by partition, and the warm-ups (partition -> member) of moves not yet made."""
    owners: dict[int, str] = {}
    for p in range(count):
        owner = previous.owner(topic, p)
        if owner is not None and owner in ring:
            owners[p] = owner
    load = Counter({member: 0 for member in ring})
    load.update(owners.values())
    for p in range(count):
        if p in owners:
            continue
        # Like Kafka Streams: the least loaded member with a caught-up copy, else the most
        # caught-up copy, else the least loaded member (which restores from the changelog).
        lags = {m: lag for m in ring if (lag := copy_lag(m, topic, p)) is not None}
        caught_up = [m for m, lag in lags.items() if lag <= ACCEPTABLE_RECOVERY_LAG]
        if caught_up:
            owners[p] = min(caught_up, key=lambda m: (load[m], lags[m], m))
        elif lags:
            owners[p] = min(lags, key=lambda m: (lags[m], load[m], m))
        else:
            owners[p] = min(ring, key=lambda m: (load[m], m))
        load[owners[p]] += 1
    # Balance: move from the most to the least loaded member, preferring its best copy; a move
    # to a member without a caught-up copy waits as a warm-up (counted as made, so the loop ends).
    warmups: dict[int, str] = {}
    while True:
        most = max(ring, key=lambda m: (load[m], m))
        least = min(ring, key=lambda m: (load[m], m))
        if load[most] - load[least] <= 1:
            return owners, warmups
        candidates = [p for p, owner in owners.items() if owner == most and p not in warmups]
        if not candidates:  # its load is warm-ups it receives: nothing of its own to give
            return owners, warmups
        copies = {q: copy_lag(least, topic, q) for q in candidates}
        p = min(candidates, key=lambda q: (copies[q] is None, copies[q] or 0, q))
        lag = copies[p]
        if lag is not None and lag <= ACCEPTABLE_RECOVERY_LAG:
            owners[p] = least
        else:
            warmups[p] = least
        load[most] -= 1
        load[least] += 1


def _plan_standbys(
    topic: str,
    owners: Mapping[int, str],
    warmups: Mapping[int, str],
    ring: Sequence[str],
    previous: Assignment,
    replicas: int,
    copy_lag: CopyLag,
) -> dict[str, list[str]]:
    wanted = min(replicas, len(ring) - 1)
    held: Counter[str] = Counter()
    # Copies of one owner's partitions are spread over members, so that its failover does not
    # land all of them on one member.
    shared: Counter[tuple[str, str]] = Counter()
    standby: dict[str, list[str]] = {}
    for p, owner in sorted(owners.items()):
        # A warm-up comes on top of the standbys: the partition keeps its failover copy.
        warmup = [warmups[p]] if p in warmups else []
        former = previous.owner(topic, p)
        start = ring.index(owner)
        ring_after = [ring[(start + i) % len(ring)] for i in range(1, len(ring))]
        # Copies already warm first (sticky), then the former owner's store, then any member
        # holding a copy, then the members sharing the fewest copies with this owner.
        preference = [
            *previous.standbys(topic, p),
            *([former] if former else []),
            *sorted(
                (m for m in ring_after if copy_lag(m, topic, p) is not None),
                key=lambda m: copy_lag(m, topic, p) or 0,
            ),
            *sorted(ring_after, key=lambda m: (shared[owner, m], held[m])),
        ]
        chosen: list[str] = []
        for member in preference:
            if len(chosen) == wanted:
                break
            if member in ring and member != owner and member not in chosen + warmup:
                chosen.append(member)
        held.update(chosen)
        shared.update((owner, m) for m in chosen)
        standby[str(p)] = warmup + chosen
    return standby
