"""Cluster sentences of the step library: routing, standby reads, failover and restores, on
several real instances of one service sharing its partitions.

Loaded by :mod:`foldstream.testing.cluster_plugin` beside :mod:`foldstream.testing.steps`; its
``Then`` sentences are in :mod:`foldstream.testing.cluster_checks` and
:mod:`foldstream.testing.failover_checks`, its query load in :mod:`foldstream.testing.query_load`.
A cluster scenario starts with a ``Given a cluster of ...`` step (the cluster is started once
per module; members a scenario killed are started again by the next one); the sentences of
``steps`` then talk to its instance 1, and any instance forwards to the owner with a 307 they
follow::

    Given a cluster of 3 instances of the service
    Given a cluster of 3 instances of the service "foldstream.examples.storefront:service"
    When clients keep querying every key of store "stock" on every instance
    When clients keep querying every key of store "stock" on every instance, also with max_lag 1000
    When the owner of "fail-1" in store "stock" is killed with kill -9
    When instance 2 restarts with its state directory deleted
    When a new instance joins the cluster
    Then every key is answered in store "stock" from every instance by its owner
    Then the owners of every key in store "stock" agree with the cluster map
    Then a standby of "route-1" answers it in store "stock" with max_lag 0
    Then without max_lag the standby sends the client to the owner
    Then exactly one succeeded and the others got 409
    Then the 2 survivors own every partition
    Then it serves its partitions of store "stock", restored from the changelog
    Then each partition of the killed instance went to an instance that kept a standby copy of it
    Then the new instance takes over partitions once its standby copies have caught up
    Then the partitions that stayed with their owner were answered throughout, never with 503

The longer ones: ``Given products "route-1" to "route-30" accepted "receive_shipment" with
{"quantity": <n>} through the instances in turn`` (``<n>`` is the number in each id; instance
1, 2, 3, 1, ... take the commands), ``When 9 clients send "sell" with {"quantity": 7} to product
"c-1" at once, expecting version 2, through the instances in turn`` and ``Then every key is
answered again within 30 seconds, with no wrong answer and only 200, 307 or 503 seen``.

"Every key" is every key the scenario wrote: the ids of the ``... to ...`` step, else the keys a
producer step of :mod:`foldstream.testing.steps` wrote. The value each must have is the one a
plain-Python fold of the store's topic gives, read when the step starts. Waiting steps wait for
a condition (at most ``WAIT`` seconds), never for a fixed time.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pytest_bdd import given, parsers, when

from foldstream.kafka import partition_for
from foldstream.process import InstanceProcess, http
from foldstream.projections.reference import fold_topic
from foldstream.testing.plugin import InstancePool
from foldstream.testing.query_load import QueryLoad
from foldstream.testing.steps import (
    NAME,
    REQUEST_ERRORS,
    WAIT,
    ScenarioState,
    _source,
    wait_until,
)


@dataclass
class Store:
    """Where a store's keys live: its source topic, partition count and partitioner."""

    name: str
    topic: str
    partitions: int
    partitioner: Any

    @classmethod
    def of(cls, instance: InstanceProcess, name: str) -> Store:
        projection, topic, partitions = _source(instance, name)
        return cls(name, topic, partitions, projection.partitioner)

    def partition(self, key: str) -> int:
        return partition_for(key.encode(), self.partitions, self.partitioner)

    def path(self, key: str) -> str:
        return f"/stores/{self.name}/keys/{key}"


@dataclass
class ClusterState:
    """What one cluster scenario's steps leave for the next ones."""

    members: list[InstanceProcess] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    standby: str = ""
    owner: str = ""
    standby_path: str = ""
    answers: list[tuple[int, Any]] = field(default_factory=list)
    load: QueryLoad | None = None
    killed_at: float = 0.0
    restarted: InstanceProcess | None = None
    joined: InstanceProcess | None = None
    before: dict[str, Any] = field(default_factory=dict)  # the map before a kill or a join
    victim: str = ""
    log_offset: int = 0
    held: list[int] = field(default_factory=list)  # the victim's partitions when it was paused

    def live(self) -> list[InstanceProcess]:
        assert self.members, "no cluster in this scenario: start with 'Given a cluster of ...'"
        return [m for m in self.members if m.process is not None and m.process.poll() is None]


@pytest.fixture
def cluster_state() -> Iterator[ClusterState]:
    state = ClusterState()
    yield state
    if state.load is not None:  # the scenario failed before its load was stopped
        state.load.stop()
    if state.joined is not None:  # leaves: the next scenario finds the cluster it started
        state.joined.stop()


def cluster_view(instance: InstanceProcess) -> dict[str, Any]:
    """``GET /cluster``: the members and each partition's active and standby URLs."""
    status, view = http("GET", f"{instance.url}/cluster", timeout=10)
    assert status == 200, view
    return view  # type: ignore[no-any-return]


def member_ids(view: dict[str, Any]) -> dict[str, str]:
    return {m["url"]: m["id"] for m in view["instances"]}


def owner_in(view: dict[str, Any], store: Store, key: str) -> str:
    return view["partitions"][store.topic][str(store.partition(key))]["active"]  # type: ignore[no-any-return]


def written(
    instance: InstanceProcess,
    store: Store,
    cluster_state: ClusterState,
    scenario_state: ScenarioState,
) -> dict[str, Any]:
    """``{key: value}`` of the keys this scenario wrote, as a plain fold of the topic has them."""
    keys = cluster_state.keys or list(
        dict.fromkeys(key.decode() for key, _ in scenario_state.produced)
    )
    assert keys, "no keys were written in this scenario"
    projection, _, _ = _source(instance, store.name)
    folded = fold_topic(instance.bootstrap, projection, store.topic, store.partitions)
    absent = [key for key in keys if folded.get(key) is None]
    assert not absent, f"{store.topic} holds no value for {absent}"
    return {key: folded[key] for key in keys}


def answer_of(url: str, value: Any) -> dict[str, Any]:
    """The body of a 200 answer to ``url`` (redirects not followed) carrying ``value``, once
    there is one (the projection or a standby copy may still be catching up)."""
    last: dict[str, Any] = {}

    def answered() -> dict[str, Any] | None:
        try:
            last["answer"] = http("GET", url, follow_redirects=False, timeout=10)
        except REQUEST_ERRORS as exc:
            last["answer"] = exc
            return None
        status, body = last["answer"]
        return body if status == 200 and body["value"] == value else None  # type: ignore[no-any-return]

    return wait_until(answered, lambda: f"{url} answered {last.get('answer')}, wanted {value}")  # type: ignore[no-any-return]


# Given ---------------------------------------------------------------------------------------


@given(
    parsers.re(r'a cluster of (?P<size>\d+) instances of the service(?: "(?P<service>[^"]+)")?'),
    target_fixture="instance",
)
def a_cluster(
    instances: InstancePool,
    foldstream_service: str,
    cluster_state: ClusterState,
    size: str,
    service: str | None,
) -> InstanceProcess:
    """Started (or found running) and stable: every partition has a live owner and a caught-up
    standby on every member's map. The single-instance steps then use instance 1."""
    cluster_state.members = instances.cluster(service or foldstream_service, int(size))
    return cluster_state.members[0]


@given(
    parsers.re(
        rf'(?P<aggregate>{NAME})s "(?P<prefix>[^"]*?)(?P<first>\d+)" to '
        rf'"(?P=prefix)(?P<last>\d+)" accepted "(?P<command>{NAME})" '
        r"with (?P<arguments>\{.*\}) through the instances in turn"
    )
)
def commands_accepted_in_turn(
    cluster_state: ClusterState,
    aggregate: str,
    prefix: str,
    first: str,
    last: str,
    command: str,
    arguments: str,
) -> None:
    """One command per id, sent to instance 1, 2, ... in turn (redirects to the owner followed);
    ``<n>`` in the arguments is the id's number."""
    members = cluster_state.live()
    for turn, n in enumerate(range(int(first), int(last) + 1)):
        key = f"{prefix}{n}"
        url = f"{members[turn % len(members)].url}/commands/{aggregate}/{key}/{command}"
        status, body = http("POST", url, json.loads(arguments.replace("<n>", str(n))))
        assert status == 200, f"{url}: {status} {body}"
        cluster_state.keys.append(key)


# When ----------------------------------------------------------------------------------------


@when(
    parsers.re(
        rf'(?P<clients>\d+) clients send "(?P<command>{NAME})" with (?P<arguments>\{{.*\}}) to '
        rf'(?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)" at once, expecting version '
        r"(?P<version>\d+), through the instances in turn"
    )
)
def concurrent_commands(
    cluster_state: ClusterState,
    clients: str,
    command: str,
    arguments: str,
    aggregate: str,
    aggregate_id: str,
    version: str,
) -> None:
    """Every client waits at a barrier, then posts with ``?expected_version=``."""
    members = cluster_state.live()
    barrier = threading.Barrier(int(clients))
    lock = threading.Lock()

    def send(instance: InstanceProcess) -> None:
        url = (
            f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}"
            f"?expected_version={version}"
        )
        barrier.wait(timeout=30)
        try:
            answer = http("POST", url, json.loads(arguments))
        except REQUEST_ERRORS as exc:
            answer = (0, repr(exc))
        with lock:
            cluster_state.answers.append(answer)

    threads = [
        threading.Thread(target=send, args=(members[n % len(members)],), daemon=True)
        for n in range(int(clients))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT)
    assert len(cluster_state.answers) == int(clients), f"answered: {cluster_state.answers}"


@when(
    parsers.re(
        r'clients keep querying every key of store "(?P<store>[^"]+)" on every instance'
        r"(?:, also with max_lag (?P<max_lag>\d+))?"
    )
)
def query_load(
    cluster_state: ClusterState, scenario_state: ScenarioState, store: str, max_lag: str | None
) -> None:
    """Once instance 1 answers every key with its value (redirects followed), and with a
    ``max_lag`` every instance does so with it too (the standby copies have caught up), starts
    the load and returns when every instance has been asked for every key."""
    members = cluster_state.live()
    where = Store.of(members[0], store)
    expected = written(members[0], where, cluster_state, scenario_state)
    asked = [(members[0].url + where.path(key), value) for key, value in expected.items()]
    if max_lag is not None:
        asked += [
            (f"{member.url}{where.path(key)}?max_lag={max_lag}", value)
            for member in members
            for key, value in expected.items()
        ]
    for url, value in asked:
        wait_until(
            lambda u=url, v=value: (s := http("GET", u))[0] == 200 and s[1]["value"] == v,  # type: ignore[misc]
            lambda u=url: f"{u} not answered with its value before the load",  # type: ignore[misc]
        )
    lag = None if max_lag is None else int(max_lag)
    load = QueryLoad(members, where, expected, max_lag=lag)
    cluster_state.load = load
    wait_until(
        lambda: min(load.rounds.values()) >= 1 or load.wrong,
        lambda: f"no full round of queries: {load.rounds}",
    )
    assert not load.wrong, load.wrong


@when(parsers.parse('the owner of "{key}" in store "{store}" is killed with kill -9'))
def kill_owner(cluster_state: ClusterState, key: str, store: str) -> None:
    """SIGKILL the process group of the instance owning ``key``'s partition."""
    live = cluster_state.live()
    status, owners = http("GET", f"{live[0].url}/stores/{store}/owners/{key}")
    assert status == 200, owners
    victim = next(m for m in live if m.url == owners["active"])
    cluster_state.before, cluster_state.victim = cluster_view(live[0]), victim.url
    if cluster_state.load is not None:
        cluster_state.load.mark_dead(victim.url)
    cluster_state.killed_at = time.monotonic()
    victim.kill()
    if cluster_state.load is not None:  # reaped: its connections are closed from now on
        cluster_state.load.dead_since = time.monotonic()


@when(parsers.parse("instance {number:d} restarts with its state directory deleted"))
def restart_without_state(cluster_state: ClusterState, number: int) -> None:
    """Stopped, its state directory removed, started again; returns once it is ready."""
    member = cluster_state.members[number - 1]
    member.stop()
    shutil.rmtree(member.state_dir, ignore_errors=True)
    assert not member.state_dir.exists()
    cluster_state.log_offset = member.log_path.stat().st_size if member.log_path.exists() else 0
    member.start()
    member.wait_ready(timeout=WAIT)
    cluster_state.restarted = member


@when("a new instance joins the cluster")
def join_cluster(
    cluster_state: ClusterState, instances: InstancePool, foldstream_service: str
) -> None:
    """One more instance of the cluster's service starts; returns once it is ready (it follows
    the assignment, possibly with no partition of its own yet)."""
    members = cluster_state.live()
    cluster_state.before = cluster_view(members[0])
    joiner = instances.joiner(members[0].service, len(cluster_state.members))
    cluster_state.joined = joiner.start()
    joiner.wait_ready(timeout=WAIT)
