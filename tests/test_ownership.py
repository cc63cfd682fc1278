"""The ownership rules: claim only what every other member released, release before applying,
retry a failed takeover, never let a stale view undo a newer one."""

from __future__ import annotations

from foldstream.cluster.assignment import Assignment, applied_at_least
from foldstream.cluster.ownership import Ownership
from foldstream.cluster.records import MemberState

T = "svc.events"


def member(member_id: str, *, applied: Assignment, active=(), restoring=(), epoch=0):
    return MemberState(
        id=member_id,
        url=f"http://127.0.0.1/{member_id}",
        epoch=epoch,
        generation=applied.generation,
        leader=applied.leader,
        active={T: list(active)} if active else {},
        restoring={T: list(restoring)} if restoring else {},
    )


def assignment(generation: int, leader: str, owners: dict[int, str]) -> Assignment:
    return Assignment(generation, leader, {T: {str(p): m for p, m in owners.items()}})


def test_a_member_claims_only_once_every_other_member_applied_the_assignment() -> None:
    first = assignment(1, "a", {0: "a", 1: "a"})
    second = assignment(2, "a", {0: "a", 1: "b"})
    b = Ownership("b")
    assert b.lost(second) == frozenset()
    assert b.apply(second)
    # a has not applied generation 2 yet: it may still be writing partition 1
    others = {"a": member("a", applied=first, active=[0, 1])}
    assert b.claimable(second, others, now=0.0) == frozenset()
    # a applied it but still claims partition 1: not yet
    others = {"a": member("a", applied=second, active=[0, 1])}
    assert b.claimable(second, others, now=0.0) == frozenset()
    others = {"a": member("a", applied=second, active=[0])}
    assert b.claimable(second, others, now=0.0) == {(T, 1)}


def test_two_plans_of_one_generation_are_different_assignments() -> None:
    """Two members that each planned generation 1 for themselves (started together): the one
    that applied the other leader's plan has not applied the smaller leader's."""
    mine = assignment(1, "a", {0: "a", 1: "b"})
    theirs = assignment(1, "b", {0: "b", 1: "b"})
    assert mine.supersedes(theirs)
    assert not applied_at_least(theirs.identity, mine.identity)
    assert applied_at_least(mine.identity, theirs.identity)
    a = Ownership("a")
    a.apply(mine)
    others = {"b": member("b", applied=theirs, active=[0, 1])}
    assert a.claimable(mine, others, now=0.0) == frozenset()


def test_a_member_must_apply_the_assignment_itself_before_claiming() -> None:
    plan = assignment(1, "a", {0: "a"})
    a = Ownership("a")
    assert a.claimable(plan, {}, now=0.0) == frozenset()
    a.apply(plan)
    assert a.claimable(plan, {}, now=0.0) == {(T, 0)}


def test_what_the_assignment_takes_away_is_lost_serving_or_restoring() -> None:
    a = Ownership("a", serving={(T, 0)}, restoring={(T, 1)})
    assert a.lost(assignment(2, "a", {0: "b", 1: "b", 2: "a"})) == {(T, 0), (T, 1)}


def test_each_claim_raises_the_epoch_above_every_epoch_seen() -> None:
    a = Ownership("a", epoch=3)
    assert a.claim(frozenset({(T, 0)}), newest_epoch=7) == 8
    assert a.claim(frozenset({(T, 1)}), newest_epoch=2) == 9


def test_a_partition_released_while_restoring_is_not_served_after_its_takeover() -> None:
    a = Ownership("a")
    a.claim(frozenset({(T, 0), (T, 1)}), newest_epoch=0)
    a.release({(T, 1)})
    assert a.took_over(frozenset({(T, 0), (T, 1)}), epoch=4) == {(T, 0)}
    assert a.serving == {(T, 0)} and not a.restoring and a.epoch == 4


def test_a_failed_takeover_is_claimed_again_after_a_backoff_and_never_dropped() -> None:
    plan = assignment(1, "a", {0: "a"})
    a = Ownership("a")
    a.apply(plan)
    claimed = a.claimable(plan, {}, now=0.0)
    a.claim(claimed, newest_epoch=0)
    delay = a.takeover_failed(claimed, now=10.0)
    assert delay > 0 and not a.held()
    assert a.claimable(plan, {}, now=10.0) == frozenset()
    assert a.claimable(plan, {}, now=10.0 + delay) == {(T, 0)}


def test_a_newer_claim_by_another_member_supersedes_what_is_served_here() -> None:
    plan = assignment(3, "b", {0: "b"})
    a = Ownership("a", serving={(T, 0), (T, 1)}, epoch=5)
    others = {
        "b": member("b", applied=plan, active=[0], epoch=6),
        "c": member("c", applied=plan, active=[1], epoch=4),
    }
    assert a.superseded(others) == {(T, 0)}
