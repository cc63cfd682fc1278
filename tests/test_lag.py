"""Readiness needs a lag figure for every copy this instance serves."""

from __future__ import annotations

from foldstream.cluster.lag import unmeasured


def test_a_copy_without_a_lag_figure_is_not_caught_up() -> None:
    active = {"stock/0", "stock/1", "prices/1"}
    # The source's end of partition 1 is not learnt yet: no figure for its copies.
    assert unmeasured(active, {"stock/0": 0}) == ["prices/1", "stock/1"]
    assert unmeasured(active, {"stock/0": 0, "stock/1": 3, "prices/1": 0}) == []
    # Standby copies measured beside them do not stand in for an active one.
    assert unmeasured({"stock/2"}, {"stock/0": 0}) == ["stock/2"]
