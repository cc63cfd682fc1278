"""Readiness needs a lag figure for every copy this instance serves."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.changelog import StandbyReplicas, StoreLayout
from foldstream.cluster.lag import LagMeter, partition_lag, unmeasured
from foldstream.cluster.node import _copy_lag
from foldstream.cluster.records import MemberState
from foldstream.end_probes import ProbedEnds
from foldstream.kafka import TopicSpec, ensure_topics, producer_config
from foldstream.settings import AGGREGATE_STORE
from foldstream.state import RocksDBWriter, partition_path
from foldstream.state.local import LocalStores
from foldstream.testing.kafka import await_settled


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


def _measured(meter: LagMeter, topic: str, timeout: float = 20.0) -> int:
    """The lag of the ``stock/0`` copy, once the probe of ``topic`` answered."""
    deadline = time.monotonic() + timeout
    while (lag := meter.measure([(topic, 0)]).get("stock/0")) is None:
        assert time.monotonic() < deadline, "the probe never answered"
        time.sleep(0.05)
    return lag


def _topic_of_two_records(broker: KafkaCluster) -> str:
    """A new topic of one partition holding two plain records (offsets 0-1)."""
    topic = f"lag-{uuid.uuid4().hex[:8]}.events"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, 1)])
    plain = Producer(producer_config(broker.bootstrap))
    for n in range(2):
        plain.produce(topic, key=b"k", value=b"%d" % n, partition=0)
    assert plain.flush(30) == 0
    return topic


@contextmanager
def _meter(
    broker: KafkaCluster, tmp_path: Path, topic: str, stores: dict[str, StoreLayout]
) -> Iterator[tuple[LagMeter, ProbedEnds]]:
    """A lag meter of ``stores`` (their copies under ``tmp_path``) and the probe of ``topic``'s
    ends it uses, closed after."""
    replicas = StandbyReplicas(bootstrap=broker.bootstrap, state_dir=tmp_path, layouts=stores)
    ends = ProbedEnds(broker.bootstrap, topic, [0])
    local = LocalStores(tmp_path)
    try:
        yield (
            LagMeter(
                bootstrap=broker.bootstrap,
                stores=stores,
                local=local,
                replicas=replicas,
                ends={topic: ends},
            ),
            ends,
        )
    finally:
        local.close()
        ends.close()
        replicas.close()


def test_a_copy_of_every_committed_record_is_not_behind_an_open_or_aborted_transaction(
    tmp_path: Path, broker: KafkaCluster
) -> None:
    """The end is the last stable offset: an open transaction is nothing to fold yet. Aborted
    (its writer fenced), its records and markers are nothing to fold ever: the span up to the
    end holds no record a reader is given."""
    topic = _topic_of_two_records(broker)
    copy = RocksDBWriter(partition_path(tmp_path, "stock", 0), identity=f"{topic}/0")
    copy.write({b"k": b"folded"}, 1)  # folded offsets 0-1
    copy.close()
    transactional_id = f"lag-{uuid.uuid4().hex}"
    zombie = Producer(producer_config(broker.bootstrap, **{"transactional.id": transactional_id}))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for n in range(3):
        zombie.produce(topic, key=b"k", value=b"zombie-%d" % n, partition=0)
    assert zombie.flush(30) == 0  # offsets 2-4, open
    stores = {"stock": StoreLayout(topic, f"{topic}.stock.changelog")}
    with _meter(broker, tmp_path, topic, stores) as (meter, ends):
        assert _measured(meter, topic) == 0
        fencer = Producer(
            producer_config(broker.bootstrap, **{"transactional.id": transactional_id})
        )
        fencer.init_transactions(30)  # the zombie's transaction is aborted: its marker is 5
        assert ends.ends() == {0: 6}
        _measured(meter, topic)  # a new span is taken as it is (a projection at work moves it)
        assert _measured(meter, topic) == 0  # the same span again: found to hold no record


def test_stores_of_one_topic_at_different_offsets_are_each_found_caught_up(
    tmp_path: Path, broker: KafkaCluster
) -> None:
    """Two stores of one topic stand at different offsets before an aborted transaction (one
    restored from a copy whose last change came earlier): each span is probed on its own. Kept
    per partition, the spans alternated between the stores, were never probed, and an idle
    owner reported a lag forever (its standbys, counted with it, never caught up)."""
    topic = _topic_of_two_records(broker)
    for store, folded in (("stock", 1), ("sales", 0)):
        copy = RocksDBWriter(partition_path(tmp_path, store, 0), identity=f"{topic}/0")
        copy.write({b"k": b"folded"}, folded)
        copy.close()
    transactional_id = f"lag-{uuid.uuid4().hex}"
    zombie = Producer(producer_config(broker.bootstrap, **{"transactional.id": transactional_id}))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, key=b"k", value=b"zombie", partition=0)
    assert zombie.flush(30) == 0  # offset 2
    zombie.abort_transaction(30)  # its marker is 3
    stores = {
        "stock": StoreLayout(topic, f"{topic}.stock.changelog"),
        "sales": StoreLayout(topic, f"{topic}.sales.changelog"),
    }
    with _meter(broker, tmp_path, topic, stores) as (meter, ends):
        await_settled(broker.bootstrap, topic, 1)  # the abort's marker written
        assert ends.ends() == {0: 4}
        _measured(meter, topic)  # the spans seen first are taken as they are
        lag = meter.measure([(topic, 0)])
        # stock's span (2, 4) holds no record; sales's (1, 4) holds offset 1, not folded yet.
        assert (lag["stock/0"], lag["sales/0"]) == (0, 3)
