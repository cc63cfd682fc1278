"""Readiness needs a lag figure for every copy this instance serves."""

from __future__ import annotations

from foldstream.changelog import StoreLayout
from foldstream.cluster.lag import partition_lag, unmeasured
from foldstream.cluster.node import _copy_lag
from foldstream.cluster.records import MemberState


def test_a_copy_without_a_lag_figure_is_not_caught_up() -> None:
    active = {"stock/0", "stock/1", "prices/1"}
    # The source's end of partition 1 is not learnt yet: no figure for its copies.
    assert unmeasured(active, {"stock/0": 0}) == ["prices/1", "stock/1"]
    assert unmeasured(active, {"stock/0": 0, "stock/1": 3, "prices/1": 0}) == []
    # Standby copies measured beside them do not stand in for an active one.
    assert unmeasured({"stock/2"}, {"stock/0": 0}) == ["stock/2"]


def test_a_partition_no_store_reads_has_nothing_to_copy() -> None:
    """A service whose stores all read another producer's topic still has its events topic:
    a member taking one of its partitions over has no copy to catch up first."""
    stores = {"bookings": StoreLayout("railway.bookings", "b.bookings.changelog")}
    assert partition_lag({}, stores, "b.events", 1) == 0
    assert partition_lag({}, stores, "railway.bookings", 1) is None
    assert partition_lag({"bookings/1": 7}, stores, "railway.bookings", 1) == 7
    member = MemberState(id="bookings-1", url="http://127.0.0.1:1")
    assert _copy_lag(stores, member, "b.events", 1) == 0  # any member may take it at once
    assert _copy_lag(stores, member, "railway.bookings", 1) is None
