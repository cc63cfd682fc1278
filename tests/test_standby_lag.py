"""A standby copy's lag counts the changelog records it has not applied, including those it
cannot read yet: never 0 while the owner's records land past it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.changelog import StandbyReplicas
from foldstream.kafka import producer_config
from tests.test_changelog import _layout, _send


def _until(condition: Callable[[], bool], what: Callable[[], Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what()}"
        time.sleep(0.05)


def test_a_copy_held_at_an_open_transaction_counts_the_records_past_it(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """The copy reads committed records only: a transaction left open on its changelog (a
    writer killed mid-transaction) stops it at the transaction's first record, while the
    owner's next batches land after it. Its lag counts them (it used to be 0 there, the end
    of what it could read, and the copy answered ``max_lag=0`` reads with replaced values)."""
    layout = _layout(broker, "held")
    _send(broker.bootstrap, layout.changelog_topic, [(1, 10, b"a", b"a@10", "<>")])
    replicas = StandbyReplicas(
        bootstrap=broker.bootstrap, state_dir=tmp_path, layouts={"s": layout}
    )
    open_writer = Producer(
        producer_config(broker.bootstrap, **{"transactional.id": f"held-{uuid.uuid4().hex}"})
    )
    open_writer.init_transactions(30)
    try:
        replicas.assign([("s", 0)])
        _until(lambda: replicas.lag("s", 0) == 0, lambda: replicas.lag("s", 0))
        assert replicas.applied_offset("s", 0) == 10
        open_writer.begin_transaction()
        open_writer.produce(layout.changelog_topic, key=b"x", value=b"open", partition=0)
        assert open_writer.flush(30) == 0
        owner_batches = [(1, 20, b"b", b"b@20", "<>"), (1, 30, b"c", b"c@30", "<>")]
        _send(broker.bootstrap, layout.changelog_topic, owner_batches)
        # Offsets: 0 a, 1 the open record, 2 b, 3 c; the copy is at 1 and cannot pass it.
        _until(lambda: replicas.lag("s", 0) == 3, lambda: replicas.lag("s", 0))
        assert replicas.applied_offset("s", 0) == 10 and replicas.get("s", 0, b"b") is None
        open_writer.abort_transaction(30)
        _until(lambda: replicas.applied_offset("s", 0) == 30, lambda: replicas.lag("s", 0))
        _until(lambda: replicas.lag("s", 0) == 0, lambda: replicas.lag("s", 0))
        assert [replicas.get("s", 0, k) for k in (b"a", b"b", b"c", b"x")] == [
            b"a@10",
            b"b@20",
            b"c@30",
            None,
        ]
    finally:
        replicas.close()
