"""The assignment plan: sticky, standby-aware, balanced without moving cold partitions."""

from __future__ import annotations

from collections import Counter

from foldstream.cluster.assignment import ACCEPTABLE_RECOVERY_LAG, Assignment, plan
from foldstream.cluster.records import parse_assignment

TOPIC = "svc.events"


def _assign(members, previous=None, copies=None, replicas=1, count=6):
    previous = previous or Assignment()
    copies = copies or {}
    active, standby, warmups = plan(
        {TOPIC: count},
        members,
        previous,
        standby_replicas=replicas,
        copy_lag=lambda m, t, p: copies.get((m, p)),
    )
    return Assignment(previous.generation + 1, min(members), active, standby, warmups)


def _loads(assignment):
    return Counter(assignment.active[TOPIC].values())


def test_first_plan_is_balanced_with_standbys_never_on_the_owner():
    a = _assign(["a", "b", "c"])
    assert sorted(_loads(a).values()) == [2, 2, 2]
    for p in range(6):
        standbys = a.standbys(TOPIC, p)
        assert len(standbys) == 1 and a.owner(TOPIC, p) not in standbys


def test_planning_again_changes_nothing():
    a = _assign(["a", "b", "c"])
    b = _assign(["a", "b", "c"], previous=a)
    assert a.same_plan((b.active, b.standby, b.warmups))


def test_a_dead_members_partitions_go_to_their_standbys_and_the_rest_stay():
    a = _assign(["a", "b", "c"])
    copies = {(m, p): 0 for p in range(6) for m in a.standbys(TOPIC, p)}
    b = _assign(["a", "b"], previous=a, copies=copies)
    for p in range(6):
        if a.owner(TOPIC, p) == "c":
            assert b.owner(TOPIC, p) == a.standbys(TOPIC, p)[0]
        else:
            assert b.owner(TOPIC, p) == a.owner(TOPIC, p)
    assert sorted(_loads(b).values()) == [3, 3]


def test_the_most_caught_up_copy_wins_an_orphan():
    previous = Assignment(1, "a", {TOPIC: {"0": "c"}}, {TOPIC: {"0": ["a", "b"]}})
    b = _assign(
        ["a", "b"],
        previous,
        copies={("a", 0): 3 * ACCEPTABLE_RECOVERY_LAG, ("b", 0): ACCEPTABLE_RECOVERY_LAG + 1},
        count=1,
        replicas=2,
    )
    assert b.owner(TOPIC, 0) == "b"


def test_a_joining_member_warms_up_before_it_takes_partitions():
    a = _assign(["a", "b"])
    joined = _assign(["a", "b", "c"], previous=a)
    assert joined.active == a.active, "no partition moves to a member without a copy"
    warming = joined.standby_of("c")
    assert len(warming) == 2
    assert {(TOPIC, int(p)) for p in joined.warmups[TOPIC]} == warming
    for _, p in warming:
        assert len(joined.standbys(TOPIC, p)) == 2, "the failover standby is kept"
    behind = {("c", p): ACCEPTABLE_RECOVERY_LAG + 1 for _, p in warming}
    assert _assign(["a", "b", "c"], previous=joined, copies=behind).active == a.active
    caught_up = {("c", p): 0 for _, p in warming}
    moved = _assign(["a", "b", "c"], previous=joined, copies=caught_up)
    assert moved.owned_by("c") == warming
    assert sorted(_loads(moved).values()) == [2, 2, 2]
    assert moved.warmups == {TOPIC: {}}
    again = _assign(["a", "b", "c"], previous=moved, copies=caught_up)
    assert moved.same_plan((again.active, again.standby, again.warmups))


def test_newer_generation_supersedes_and_the_smaller_leader_wins_a_tie():
    assert Assignment(2, "b").supersedes(Assignment(1, "a"))
    assert Assignment(2, "a").supersedes(Assignment(2, "b"))
    assert not Assignment(2, "b").supersedes(Assignment(2, "a"))
    assert not Assignment(2, "a").supersedes(Assignment(2, "a"))


def test_round_trips_through_json():
    a = _assign(["a", "b", "c"])
    assert parse_assignment(a.to_json()) == a
