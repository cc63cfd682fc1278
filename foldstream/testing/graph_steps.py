"""Sentences for services whose stores form a graph (re-keyed, chained and joined stores):
random traffic as ``foldstream demo`` sends it, and every store of the service, every key, on
every copy, compared with a plain-Python computation of the whole graph from the topics
(:func:`~foldstream.projections.reference_graph.fold_service`)::

    When 200 random commands of the demo are sent through the instances in turn
    When 300 random commands of the demo are sent through the instances in turn, instance 2 killed with kill -9 after 100
    Then every store of the service answers what a plain-Python computation of its topics gives
    Then every copy of every store holds what a plain-Python computation of its topics gives
    Then store "exposure" dead-lettered what was forwarded from the last record of "market.prices" with key "X", naming the store, the topic, the partition and the offset

Works on one instance (``Given the service ... is running``) and on a cluster (``Given a
cluster of ...``). The service's demo records (price ticks, say: :class:`~foldstream.service.DemoRecords`) are
written before and after the commands; their topics must exist before the service starts (``Given the topic "..." has 3 partitions``).
"""  # noqa: E501 - the sentences are quoted whole

from __future__ import annotations

import json
import random
from typing import Any

from pytest_bdd import parsers, then, when

from foldstream.demo import command_menu, random_command
from foldstream.demo_stores import write_demo_records
from foldstream.kafka import read_to_end, topic_partitions
from foldstream.kafka_client import admin_client
from foldstream.process import InstanceProcess, http, lookup, wait_cluster_stable
from foldstream.projections.graph import is_hidden
from foldstream.projections.poison import DLQ_ERROR_HEADER
from foldstream.projections.reference_graph import fold_service
from foldstream.state import RocksDBReader, partition_path
from foldstream.testing.cluster_steps import ClusterState, Store, cluster_view
from foldstream.testing.poison_steps import dead_letters
from foldstream.testing.steps import REQUEST_ERRORS, WAIT, service_of, wait_until


def _members(instance: InstanceProcess, cluster_state: ClusterState) -> list[InstanceProcess]:
    return cluster_state.live() if cluster_state.members else [instance]


def _send(members: list[InstanceProcess], turn: int, path: str, arguments: Any) -> int:
    """POST ``arguments`` to ``path`` through a live member, again until it is answered 200 or
    422 (an owner just killed is unreachable until its partitions move)."""
    answer: dict[str, Any] = {}

    def answered() -> bool:
        live = [m for m in members if m.process is not None and m.process.poll() is None]
        try:
            answer["status"], answer["body"] = http(
                "POST", live[turn % len(live)].url + path, arguments
            )
        except REQUEST_ERRORS as exc:
            answer["status"], answer["body"] = 0, repr(exc)
        return answer["status"] in (200, 422)

    wait_until(answered, lambda: f"{path}: {answer}")
    return int(answer["status"])


def _traffic(
    instance: InstanceProcess,
    cluster_state: ClusterState,
    commands: int,
    kill: tuple[int, int] | None = None,
) -> None:
    """``commands`` random commands; the service's demo records (if any) written before and
    after them, so that other producers' records come both before and after the events."""
    members = _members(instance, cluster_state)
    service, _ = service_of(instance)
    menu, rng = command_menu(service), random.Random(commands)
    if service.demo is not None:
        write_demo_records(instance.bootstrap, service, rng)
    accepted = 0
    for turn in range(commands):
        if kill is not None and turn == kill[1]:
            members[kill[0] - 1].kill()
        aggregate, aggregate_id, command, arguments = random_command(menu, rng)
        path = f"/commands/{aggregate}/{aggregate_id}/{command}"
        accepted += _send(members, turn, path, arguments) == 200
    if service.demo is not None:
        write_demo_records(instance.bootstrap, service, rng)
    assert accepted, "no command was accepted"


@when(
    parsers.parse("{commands:d} random commands of the demo are sent through the instances in turn")
)
def random_traffic(instance: InstanceProcess, cluster_state: ClusterState, commands: int) -> None:
    _traffic(instance, cluster_state, commands)


@when(
    parsers.parse(
        "{commands:d} random commands of the demo are sent through the instances in turn, "
        "instance {number:d} killed with kill -9 after {sent:d}"
    )
)
def random_traffic_with_a_kill(
    instance: InstanceProcess, cluster_state: ClusterState, commands: int, number: int, sent: int
) -> None:
    _traffic(instance, cluster_state, commands, kill=(number, sent))


def _expected(instance: InstanceProcess) -> dict[str, dict[str, Any]]:
    service, settings = service_of(instance)
    expected = fold_service(instance.bootstrap, service.projections, settings.events_topic)
    assert any(expected.values()), "the topics hold nothing to compare with"
    return expected


@then("every store of the service answers what a plain-Python computation of its topics gives")
def stores_answer_the_computation(instance: InstanceProcess, cluster_state: ClusterState) -> None:
    """Every key of every store, asked of every live instance (redirects followed), is answered
    with the computed value (404 for a key computed deleted)."""
    expected = _expected(instance)
    members = _members(instance, cluster_state)
    wrong: list[str] = []

    def all_answered() -> bool:
        wrong.clear()
        for member in members:
            for store, values in expected.items():
                for key, value in values.items():
                    status, body = lookup(member.url, store, key)
                    got = body.get("value") if status == 200 else None
                    if got != value:
                        wrong.append(f"{member.url} {store}/{key}: {status} {got}, not {value}")
        return not wrong

    wait_until(all_answered, lambda: f"{len(wrong)} wrong, e.g. {wrong[:3]}")


@then("every copy of every store holds what a plain-Python computation of its topics gives")
def copies_hold_the_computation(instance: InstanceProcess, cluster_state: ClusterState) -> None:
    """Every live member's active and standby copies (on disk) of every store hold the computed
    value of each of their partition's keys."""
    members = _members(instance, cluster_state)
    if len(members) > 1:
        wait_cluster_stable(members, timeout=WAIT)
    expected = _expected(instance)
    service, _ = service_of(instance)
    hidden = {p.store for p in service.projections if is_hidden(p)}
    copies = partitions = 0
    for store, values in expected.items():
        assert store not in hidden, f"{store} is hidden: it must not be served"
        where = Store.of(instance, store)
        partitions += where.partitions
        view = cluster_view(members[0])
        for partition, entry in view["partitions"][where.topic].items():
            holders = {entry["active"], *(s["url"] for s in entry["standbys"])}
            keys = {k: v for k, v in values.items() if where.partition(k) == int(partition)}
            for member in members:
                if member.url in holders:
                    _check_copy(member, store, int(partition), keys)
                    copies += 1
    if len(members) > 1:
        assert copies >= 2 * partitions, "not every partition has a standby copy"


def _check_copy(
    member: InstanceProcess, store: str, partition: int, expected: dict[str, Any]
) -> None:
    path = partition_path(member.state_dir, store, partition)
    wrong: dict[str, tuple[Any, Any]] = {}

    def matches() -> bool:
        wrong.clear()
        if not path.exists():
            wrong["(copy)"] = ("missing", str(path))
            return False
        with RocksDBReader(path) as copy:
            for key, value in expected.items():
                raw = copy.get(key.encode())
                got = None if raw is None else json.loads(raw)
                if got != value:
                    wrong[key] = (got, value)
        return not wrong

    wait_until(
        matches,
        lambda: f"{member.url}'s copy of {store}/{partition}: {list(wrong.items())[:3]}",
    )


@then(
    parsers.parse(
        'store "{store}" dead-lettered what was forwarded from the last record of "{topic}" '
        'with key "{key}", naming the store, the topic, the partition and the offset'
    )
)
def dead_lettered_forwarded(instance: InstanceProcess, store: str, topic: str, key: str) -> None:
    """The store's dead-letter topic holds a record whose error names ``store`` and the origin
    of what it could not fold: ``topic``, and the partition and offset of its last record with
    ``key``."""
    partitions = topic_partitions(admin_client(instance.bootstrap), topic)
    assert partitions, f"the topic {topic!r} does not exist"
    origins = [
        (m.partition(), m.offset())
        for batch in read_to_end(instance.bootstrap, topic, partitions)
        for m in batch
        if m.key() == key.encode()
    ]
    assert origins, f"no record with key {key!r} in {topic}"
    partition, offset = origins[-1]
    named = (f"store {store!r}", f"from {topic} partition {partition} offset {offset}")
    errors: list[str] = []

    def found() -> bool:
        errors[:] = [
            dict(m.headers() or ()).get(DLQ_ERROR_HEADER, b"").decode()
            for m in dead_letters(instance, store)
        ]
        return any(all(part in error for part in named) for error in errors)

    wait_until(found, lambda: f"{store} dead-lettered no record naming {named}: {errors}")
