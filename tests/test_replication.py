"""A replicated Apache Kafka cluster under the service: 3 nodes, topics with replication factor 3
and ``min.insync.replicas`` 2, 3 instances of the inventory example under commands and reads
from 4 clients. A broker node killed with ``kill -9`` loses no acknowledged command, commands go
on being accepted, projections and standby copies carry on, and the node's return is absorbed;
also while an instance's partitions are taken over, and while a store is rebuilt and switched
to. Every recorded operation is checked as the nemesis suite checks its runs
(docs/concepts/guarantees.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from foldstream.process import http
from tests.nemesis.checker import check
from tests.nemesis.clients import Load
from tests.nemesis.deployment import Deployment
from tests.nemesis.history import Clock, History, Op
from tests.nemesis.run import read_events, write_events

DOWN_S = 15.0  # a node stays down well past the brokers' session timeout (4 s)
SETTLED_S = 8.0  # from then on, after a kill, commands are accepted on every partition again


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    running = Deployment(root=tmp_path_factory.mktemp("replicated"))
    try:
        yield running.start()
    finally:
        running.stop()


class Loaded:
    """The load on a deployment, and the check of what it recorded."""

    def __init__(self, deployment: Deployment, seed: int) -> None:
        self.deployment = deployment
        self.clock = Clock()
        self.load = Load(deployment.urls, self.clock, seed).start()

    def acknowledged_between(self, start: float, end: float) -> list[Op]:
        return [
            op
            for op in list(self.load.ops)
            if op.kind == "command" and op.status == 200 and start <= op.start and op.end <= end
        ]

    def check(self, name: str) -> None:
        ops = self.load.stop()
        assert self.deployment.kafka is not None
        events = read_events(self.deployment.kafka.bootstrap, self.deployment.partitions)
        history = History(ops, [], self.deployment.urls)
        history.write(self.deployment.root / f"{name}.jsonl")
        write_events(self.deployment.root / f"{name}.events.jsonl", events)
        verdict = check(history, events)
        assert verdict.checked["acknowledged-once"] > 50, dict(verdict.checked)
        assert not verdict.total_violations, dict(verdict.violations)


def _await_in_sync(deployment: Deployment, timeout: float = 120.0) -> None:
    """Every partition of every topic has all 3 replicas in sync again."""
    assert deployment.kafka is not None
    admin = AdminClient({"bootstrap.servers": deployment.kafka.bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=10).topics
        short = [
            f"{name}/{p}"
            for name, topic in topics.items()
            for p, partition in topic.partitions.items()
            if len(partition.isrs) < 3
        ]
        if not short:
            return
        assert time.monotonic() < deadline, f"not back in sync: {short[:10]}"
        time.sleep(0.5)


def _await_building(deployment: Deployment, timeout: float = 120.0) -> None:
    """Every instance lists a rebuild of "stock" (generation 1) besides the version answering."""
    deadline = time.monotonic() + timeout
    for url in deployment.urls:
        while True:
            _, body = http("GET", f"{url}/stores")
            stock = next(s for s in body["stores"] if s["name"] == "stock")
            if any(v.get("generation") == 1 for v in stock["versions"]):
                break
            assert time.monotonic() < deadline, f"{url}: no rebuild listed: {stock}"
            time.sleep(0.2)


def test_a_broker_node_killed_under_command_load_loses_nothing_acknowledged(
    deployment: Deployment,
) -> None:
    loaded = Loaded(deployment, seed=11)
    time.sleep(3)
    killed_at = loaded.clock.now()
    deployment.kill_broker(2)
    time.sleep(DOWN_S)
    down_until = loaded.clock.now()
    deployment.restart_broker(2)
    accepted = loaded.acknowledged_between(killed_at + SETTLED_S, down_until)
    partitions = {op.position[0] for op in accepted if op.position}
    during = Counter(
        (op.status, op.hops[-1].error if op.hops else None)
        for op in list(loaded.load.ops)
        if op.kind == "command" and killed_at <= op.start <= down_until
    )
    _await_in_sync(deployment)
    deployment.wait_stable()
    loaded.check("under-load")
    assert partitions == set(range(6)), f"accepted while node 2 was down: {partitions}, {during}"


def test_a_broker_node_killed_during_a_takeover(deployment: Deployment) -> None:
    loaded = Loaded(deployment, seed=12)
    time.sleep(3)
    deployment.kill_instance(0)
    deployment.kill_broker(1)
    time.sleep(DOWN_S)
    deployment.restart_broker(1)
    deployment.restart_instance(0)
    _await_in_sync(deployment)
    deployment.wait_stable()
    loaded.check("takeover")


def test_a_broker_node_killed_while_a_store_is_rebuilt_and_switched_to(
    deployment: Deployment,
) -> None:
    loaded = Loaded(deployment, seed=13)
    time.sleep(3)
    foldstream = Path(sys.executable).with_name("foldstream")
    rebuild = subprocess.Popen(
        [str(foldstream), "rebuild", deployment.urls[0], "stock", "--timeout", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _await_building(deployment)
    deployment.kill_broker(3)
    time.sleep(DOWN_S)
    deployment.restart_broker(3)
    output, _ = rebuild.communicate(timeout=400)
    assert rebuild.returncode == 0, output
    for url in deployment.urls:
        status, body = http("GET", f"{url}/stores")
        stock = next(s for s in body["stores"] if s["name"] == "stock")
        assert status == 200 and stock["generation"] == 1, stock
    _await_in_sync(deployment)
    deployment.wait_stable()
    loaded.check("rebuild")
