"""Cluster checks of the step library (the ``Then`` sentences of
:mod:`foldstream.testing.cluster_steps`, whose docstring lists them): who answers each key,
standby reads, restores and joiners, on the cluster a ``Given a cluster of ...`` step started
(the checks after a failover: :mod:`foldstream.testing.failover_checks`). Loaded by
:mod:`foldstream.testing.cluster_plugin` after ``cluster_steps``."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

from pytest_bdd import parsers, then

from foldstream.kafka import partition_for
from foldstream.process import InstanceProcess, http, lookup, wait_cluster_stable
from foldstream.testing.cluster_steps import (
    ClusterState,
    Store,
    answer_of,
    cluster_view,
    member_ids,
    owner_in,
    written,
)
from foldstream.testing.steps import NAME, WAIT, ScenarioState, service_of, wait_until

# Then ----------------------------------------------------------------------------------------


@then(parsers.parse('every key is answered in store "{store}" from every instance by its owner'))
def answered_by_owners(
    cluster_state: ClusterState, scenario_state: ScenarioState, store: str
) -> None:
    """From every instance: the owner the cluster map names answers 200 with the key's value
    itself (``served_by``: that instance, ``active``, the key's partition); any other instance
    answers 307 to the owner's same path."""
    members = cluster_state.live()
    where = Store.of(members[0], store)
    expected = written(members[0], where, cluster_state, scenario_state)
    view = cluster_view(members[0])
    ids = member_ids(view)
    for member in members:
        for key, value in expected.items():
            owner, path = owner_in(view, where, key), where.path(key)
            body = answer_of(owner + path, value)
            assert body["served_by"]["role"] == "active", body
            assert body["served_by"]["instance"] == ids[owner], (owner, body)
            assert body["served_by"]["partition"] == where.partition(key), body
            if member.url != owner:
                moved = http("GET", member.url + path, follow_redirects=False)
                assert moved == (307, {"location": f"{owner}{path}?hops=1"}), (member.url, moved)
            status, body = http("GET", member.url + path)
            assert status == 200 and body["value"] == value, (member.url, key, body)
            assert body["served_by"]["instance"] == ids[owner], (member.url, key, body)


@then(parsers.parse('the owners of every key in store "{store}" agree with the cluster map'))
def owners_agree(cluster_state: ClusterState, scenario_state: ScenarioState, store: str) -> None:
    """``GET /stores/{store}/owners/{key}`` of each instance names the key's partition, its
    active URL and standby URLs as ``GET /cluster`` of the next instance does; the active is a
    member and never one of the standbys."""
    members = cluster_state.live()
    where = Store.of(members[0], store)
    urls = {m.url for m in members}
    for n, member in enumerate(members):
        view = cluster_view(members[(n + 1) % len(members)])
        assert set(member_ids(view)) == urls, view["instances"]
        for key in written(member, where, cluster_state, scenario_state):
            status, owners = http("GET", f"{member.url}/stores/{store}/owners/{key}")
            assert status == 200, owners
            entry = view["partitions"][where.topic][str(where.partition(key))]
            standbys = {s["url"] for s in owners["standbys"]}
            assert owners["partition"] == where.partition(key), owners
            assert owners["active"] == entry["active"] and owners["active"] in urls, (owners, entry)
            assert standbys == {s["url"] for s in entry["standbys"]}, (owners, entry)
            assert owners["active"] not in standbys, owners


@then(parsers.parse('a standby of "{key}" answers it in store "{store}" with max_lag 0'))
def standby_answers(
    cluster_state: ClusterState, scenario_state: ScenarioState, key: str, store: str
) -> None:
    """The first standby the owners endpoint names answers ``?max_lag=0`` itself (no redirect)
    with the key's value, ``served_by`` role ``standby`` and lag 0, once its copy caught up."""
    members = cluster_state.live()
    where = Store.of(members[0], store)
    value = written(members[0], where, cluster_state, scenario_state)[key]
    _, owners = http("GET", f"{members[0].url}/stores/{store}/owners/{key}")
    assert owners["standbys"], f"no standby of {key}'s partition: {owners}"
    standby = owners["standbys"][0]["url"]
    body = answer_of(f"{standby}{where.path(key)}?max_lag=0", value)
    ids = member_ids(cluster_view(members[0]))
    assert body["served_by"] == {
        "instance": ids[standby],
        "role": "standby",
        "partition": where.partition(key),
        "lag": 0,
    }, body
    cluster_state.standby, cluster_state.owner = standby, owners["active"]
    cluster_state.standby_path = where.path(key)


@then("without max_lag the standby sends the client to the owner")
def standby_redirects(cluster_state: ClusterState) -> None:
    assert cluster_state.standby, "no standby answered in this scenario"
    path = cluster_state.standby_path
    status, moved = http("GET", cluster_state.standby + path, follow_redirects=False)
    assert status == 307 and moved["location"].startswith(cluster_state.owner + path), moved


@then("exactly one succeeded and the others got 409")
def exactly_one_succeeded(cluster_state: ClusterState) -> None:
    statuses = Counter(status for status, _ in cluster_state.answers)
    assert statuses == Counter({200: 1, 409: len(cluster_state.answers) - 1}), cluster_state.answers


@then(parsers.parse('it serves its partitions of store "{store}", restored from the changelog'))
def serves_restored(cluster_state: ClusterState, scenario_state: ScenarioState, store: str) -> None:
    """Once the restarted instance owns a partition of each topic on every map, it
    answers each of its keys itself with the value, having restored or copied (as a warm-up
    standby) changelog records into the empty state directory (its log says how many)."""
    restarted = cluster_state.restarted
    assert restarted is not None, "no instance was restarted in this scenario"
    wait_owner_of_some(restarted, cluster_state.live())
    where = Store.of(restarted, store)
    view = cluster_view(restarted)
    expected = written(restarted, where, cluster_state, scenario_state)
    mine = {k: v for k, v in expected.items() if owner_in(view, where, k) == restarted.url}
    assert mine, f"the restarted instance owns none of {sorted(expected)}: {view}"
    for key, value in mine.items():
        body = answer_of(restarted.url + where.path(key), value)
        assert body["served_by"]["role"] == "active", body
        assert body["served_by"]["instance"] == member_ids(view)[restarted.url], body
    with open(restarted.log_path, "rb") as log:
        log.seek(cluster_state.log_offset)
        since_restart = log.read().decode(errors="replace")
    restored = [
        int(n)
        for n in re.findall(r"after (?:restoring|copying) (\d+) changelog records", since_restart)
    ]
    assert sum(restored) > 0, f"no changelog records restored; log tail:\n{restarted.log_tail()}"


def _actives(view: dict[str, Any], topic: str) -> dict[str, str | None]:
    return {p: entry["active"] for p, entry in view["partitions"][topic].items()}


def wait_owner_of_some(member: InstanceProcess, members: list[InstanceProcess]) -> None:
    """Until every member's map names ``member`` the owner of a partition of each topic, and
    every partition has a live owner (a member taking over warms its copies up first)."""

    def owns_some() -> bool:
        views = [cluster_view(m) for m in members]
        return all(
            member.url in _actives(view, topic).values()
            for view in views
            for topic in view["partitions"]
        )

    wait_until(owns_some, lambda: f"map: {cluster_view(member)}")
    wait_cluster_stable(members, standbys=False, timeout=WAIT)


@then("the new instance takes over partitions once its standby copies have caught up")
def joiner_takes_over(cluster_state: ClusterState) -> None:
    """The joiner becomes the active owner of some partition on every member's map, having
    copied its stores from the changelogs as a warm-up standby first (its log says so)."""
    joiner = cluster_state.joined
    assert joiner is not None, "no instance joined in this scenario"
    wait_owner_of_some(joiner, [*cluster_state.live(), joiner])
    with open(joiner.log_path, "rb") as log:
        text = log.read().decode(errors="replace")
    assert "caught up after copying" in text, f"no warm-up copy; log tail:\n{joiner.log_tail()}"


@then("the partitions that stayed with their owner were answered throughout, never with 503")
def unmoved_never_unavailable(cluster_state: ClusterState) -> None:
    """Partitions whose owner is the same before the join and now saw no 503 from the load."""
    load = cluster_state.load
    assert load is not None, "no query load runs in this scenario"
    load.stop()
    topic = load.store.topic
    before = _actives(cluster_state.before, topic)
    after = _actives(cluster_view(cluster_state.live()[0]), topic)
    stayed = sorted(int(p) for p in before if before[p] == after[p])
    moved = sorted(int(p) for p in before if before[p] != after[p])
    print(f"\njoin: moved {moved}; statuses per partition {load.by_partition}")
    assert moved, f"no partition moved: {before} -> {after}"
    assert not load.wrong, load.wrong
    for p in stayed:
        seen = load.by_partition.get(p, Counter())
        assert seen and set(seen) <= {200, 307}, (
            f"partition {p} (stayed) saw {seen}; first answers of each kind: {load.samples}"
        )


def commands_fold_everywhere(
    members: list[InstanceProcess],
    *,
    aggregate: str,
    command: str,
    arguments: dict[str, Any],
    store: str,
    value: Any,
    partitions: int,
    prefix: str,
    retry_for: float = 0.0,
) -> None:
    """Send ``command`` to a fresh id in each of the ``partitions`` partitions of the events
    topic (through the members in turn), then wait until every member answers ``value`` for
    each id in ``store``: every partition takes commands and is folded by its owner. A command
    answered 503 is sent again for up to ``retry_for`` seconds (0: it must be accepted at
    once)."""
    stamp = time.monotonic_ns()
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < partitions:
        key = f"{prefix}{stamp}-{n}"
        keys.setdefault(partition_for(key.encode(), partitions), key)
        n += 1
    deadline = time.monotonic() + retry_for
    for turn, key in enumerate(keys.values()):
        url = f"{members[turn % len(members)].url}/commands/{aggregate}/{key}/{command}"
        status, body = http("POST", url, arguments)
        while status == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
            status, body = http("POST", url, arguments)
        assert status == 200, f"{url}: {status} {body}"
    wanted = {key: (200, {"key": key, "value": value}) for key in keys.values()}
    last: dict[str, Any] = {}

    def all_answered() -> bool:
        for member in members:
            for key, answer in wanted.items():
                last["answer"] = (member.url, key, lookup(member.url, store, key))
                if last["answer"][2] != answer:
                    return False
        return True

    wait_until(all_answered, lambda: f"(url, key, answer) last seen: {last.get('answer')}")


@then(
    parsers.re(
        rf'a "(?P<command>{NAME})" with (?P<arguments>\{{.*\}}) to a new (?P<aggregate>{NAME}) '
        rf'on every partition shows (?P<value>.+) in store "(?P<store>{NAME})" on every instance'
    )
)
def every_partition_folds(
    cluster_state: ClusterState,
    command: str,
    arguments: str,
    aggregate: str,
    value: str,
    store: str,
) -> None:
    members = cluster_state.live()
    partitions = service_of(members[0])[1].partitions
    commands_fold_everywhere(
        members,
        aggregate=aggregate,
        command=command,
        arguments=json.loads(arguments),
        store=store,
        value=json.loads(value),
        partitions=partitions,
        prefix="every-partition-",
    )
