"""The membership bench reads its figures from the members' reports as they happened: when every
partition had one owner all agreed on, when a member's partitions moved, and which writes acted
on stale ownership (bench/membership_timeline.py)."""

from __future__ import annotations

from typing import Any

from bench.membership_timeline import Timeline, moved_at, settled, stale_until, writes


def _timeline(*reports: tuple[int, str, float, dict[str, Any]]) -> Timeline:
    timeline = Timeline(partitions=2)
    for member, event, t, fields in reports:
        timeline.reports.append((member, {"ev": event, "t": t, **fields}))
    return timeline


def _owned(member: int, t: float, *partitions: int) -> tuple[int, str, float, dict[str, Any]]:
    return member, "owned", t, {"owned": list(partitions)}


def _view(member: int, t: float, owners: dict[int, int]) -> tuple[int, str, float, dict[str, Any]]:
    return member, "view", t, {"owners": {str(p): m for p, m in owners.items()}}


def _write(member: int, t: float, p: int, began: float, err: str | None = None) -> Any:
    return member, "write", t, {"p": p, "ok": err is None, "err": err, "began": began}


def test_convergence_is_when_each_partition_has_one_owner_every_member_sees_for_good() -> None:
    timeline = _timeline(
        _owned(0, 1.0, 0, 1),  # the first member takes everything
        _view(0, 1.1, {0: 0, 1: 0}),
        _view(1, 1.2, {0: 0, 1: 0}),  # agreed for a moment: a flap follows
        _owned(1, 2.0, 1),  # two owners of partition 1
        _owned(0, 2.5, 0),
        _view(0, 3.0, {0: 0, 1: 1}),
        _view(1, 3.5, {0: 0, 1: 1}),
    )
    agreed = settled(timeline, {0, 1}, since=0.0, until=10.0, views=True)
    assert agreed is not None and (agreed.at, agreed.flaps) == (3.5, 1)
    owned = settled(timeline, {0, 1}, since=0.0, until=10.0, views=False)
    assert owned is not None and owned.at == 2.5
    assert settled(timeline, {0, 1}, since=0.0, until=3.2, views=True) is None


def test_partitions_moved_when_other_members_own_them_whatever_the_stale_one_claims() -> None:
    timeline = _timeline(
        _owned(0, 1.0, 0),
        _owned(1, 1.0, 1),
        _owned(1, 5.0, 0, 1),  # takes member 0's partition; member 0 (paused) still claims it
        _owned(0, 9.0),  # resumed, it gives it up
    )
    assert moved_at(timeline, {0}, to={1}, since=0.5, until=10.0) == 5.0
    assert moved_at(timeline, {0}, to={1}, since=2.0, until=4.0) is None
    assert stale_until(timeline, 0, {0, 1}, since=8.0, until=10.0) == 9.0


def test_writes_are_told_apart_by_who_claimed_the_partition_last() -> None:
    timeline = _timeline(
        _owned(0, 1.0, 0),
        _owned(1, 1.0, 1),
        _write(0, 2.0, 0, began=1.9),  # the owner's: not counted
        _owned(1, 5.0, 0, 1),  # member 1 claims partition 0 while member 0 stands still
        _write(0, 5.5, 0, began=4.5),  # begun before the claim, committed after
        _write(0, 6.0, 0, began=5.8),  # begun after it, committed: the new writer not open yet
        _write(0, 7.0, 0, began=6.9, err="_FENCED"),  # refused: the new writer fenced it
        _write(1, 7.5, 0, began=7.4, err="_FENCED"),  # the new owner's, refused
        _owned(0, 8.0),
        _write(0, 8.1, 0, began=7.9, err="_FENCED"),  # after it gave up: still the stale one's
        _write(1, 9.0, 1, began=8.9, err="_TIMED_OUT"),
        _owned(1, 9.5, 0),
        _write(1, 9.6, 1, began=9.4, err="_FENCED"),  # in flight as it gave partition 1 up
    )
    assert writes(timeline, {0, 1}, since=0.0, until=10.0) == {
        "stale committed": 1,
        "stale refused": 2,
        "in flight at a handover": 1,
        "owner fenced": 1,
        "fenced after release": 1,
        "other": 1,
    }
