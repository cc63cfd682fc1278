"""Readiness needs a lag figure for every copy this instance serves."""

from __future__ import annotations

from pathlib import Path

from foldstream.broker import KafkaCluster
from foldstream.changelog import StandbyReplicas, StoreLayout
from foldstream.cluster.lag import LagMeter, partition_lag, unmeasured
from foldstream.cluster.node import _copy_lag
from foldstream.cluster.records import MemberState
from foldstream.settings import AGGREGATE_STORE
from foldstream.state.local import LocalStores


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


class _KnownEnds:
    """Source ends as :class:`~foldstream.end_probes.ProbedEnds` reports them, fixed."""

    def __init__(self, ends: dict[int, int]) -> None:
        self._ends = ends

    def ask(self) -> int:
        return 0

    def ends(self, timeout: float, *, asked: int | None = None) -> dict[int, int]:
        return dict(self._ends)


def test_the_aggregate_store_is_never_behind_the_events_another_writer_appends(
    tmp_path: Path, broker: KafkaCluster
) -> None:
    """The command side writes the aggregate store as it appends and replays past its
    position on takeover: events another writer appended since are nothing to catch up on,
    and must not keep the member unready (they did, in the cluster's pause scenario)."""
    stores = {
        AGGREGATE_STORE: StoreLayout("s.events", "s._aggregates.changelog", follows_source=False),
        "stock": StoreLayout("s.events", "s.stock.changelog"),
    }
    replicas = StandbyReplicas(bootstrap=broker.bootstrap, state_dir=tmp_path, layouts=stores)
    meter = LagMeter(
        bootstrap=broker.bootstrap,
        stores=stores,
        local=LocalStores(tmp_path),
        replicas=replicas,
        ends={"s.events": _KnownEnds({0: 5000})},  # type: ignore[dict-item]
    )
    try:
        lag = meter.measure([("s.events", 0)])
    finally:
        replicas.close()
    assert lag[f"{AGGREGATE_STORE}/0"] == 0
    # The projection's copy has folded nothing of the 5000 records: it is behind.
    assert lag["stock/0"] == 5000
