"""Versions of a store on a real cluster: two instances of ``foldstream.testing.versioned``,
first deployed with version 1 of ``stock`` alone, then with version 2 beside it (held back at a
gate file until the feature lets it build), under a continuous lookup load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.broker import EmbeddedBroker
from foldstream.kafka_client import admin_client
from foldstream.kafka_topics import topic_partitions
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.testing.scenario import wait_until
from foldstream.testing.versioned import GATE_ENV
from foldstream.tokens import PARAM

scenarios("versions.feature")

BEFORE = "foldstream.testing.versioned:before"
AFTER = "foldstream.testing.versioned:after"
PRODUCTS = 24
PARTITIONS = 4
#: Version 1's topics, which go once it is retired.
OLD_TOPICS = ("versioned.stock.changelog", "versioned.stock.dlq")
SWITCH_S = 180.0  # building version 2 on a loaded machine: Spark micro-batches on 2 cores


def v1(n: int) -> dict[str, int]:
    """Version 1's value of product ``sku-n`` (shipped n + 1, sold 1)."""
    return {"on_hand": n}


def v2(n: int) -> dict[str, int]:
    """Version 2's: its events are its creation, the shipment and the sale."""
    return {"on_hand": n, "moves": 3}


@dataclass
class Answer:
    key: int
    status: int
    value: Any
    instance: str | None


@dataclass
class Deployment:
    root: Path
    bootstrap: str
    gate: Path
    members: list[InstanceProcess] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    stop_load: threading.Event = field(default_factory=threading.Event)
    load: threading.Thread | None = None
    token: str = ""

    def start(self, service: str, n: int) -> InstanceProcess:
        member = InstanceProcess(
            bootstrap=self.bootstrap,
            state_dir=self.root / f"member-{n}",
            service=service,
            partitions=PARTITIONS,
            env={GATE_ENV: str(self.gate)},
        )
        return member.start()

    def deploy(self, service: str) -> None:
        for member in self.members:
            member.stop()
        self.members = [self.start(service, n) for n in (1, 2)]
        wait_cluster_stable(self.members, timeout=300)

    def close(self) -> None:
        self.stop_load.set()
        if self.load is not None:
            self.load.join(timeout=30)
        self.gate.touch()  # no fold left waiting
        for member in self.members:
            member.stop()


@pytest.fixture
def deployment(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("versioned")
    running = Deployment(root, broker.bootstrap, root / "gate")
    try:
        yield running
    finally:
        running.close()


def _look_up_continuously(deployment: Deployment) -> None:
    n = 0
    while not deployment.stop_load.is_set():
        member = deployment.members[n % 2]
        key = n % PRODUCTS
        status, body = http("GET", f"{member.url}/stores/stock/keys/sku-{key}", timeout=10)
        served_by = body.get("served_by", {}) if isinstance(body, dict) else {}
        value = body.get("value") if isinstance(body, dict) else body
        deployment.answers.append(Answer(key, status, value, served_by.get("instance")))
        n += 1


def _stores(member: InstanceProcess) -> dict[str, Any]:
    status, body = http("GET", f"{member.url}/stores")
    assert status == 200, body
    return {s["name"]: s for s in body["stores"]}


def _states(member: InstanceProcess) -> dict[int, str]:
    return {v["version"]: v["state"] for v in _stores(member)["stock"]["versions"]}


@given("a cluster of 2 instances of the service's first deployment, with 24 products moved")
def first_deployment(deployment: Deployment) -> None:
    deployment.deploy(BEFORE)
    url = deployment.members[0].url
    for n in range(PRODUCTS):
        for command, quantity in (("receive_shipment", n + 1), ("sell", 1)):
            status, body = http(
                "POST", f"{url}/commands/product/sku-{n}/{command}", {"quantity": quantity}
            )
            assert status == 200, body
    for n in range(PRODUCTS):
        wait_until(
            lambda n=n: http("GET", f"{url}/stores/stock/keys/sku-{n}")[1].get("value") == v1(n),
            lambda n=n: f"sku-{n} never answered {v1(n)}",
        )


@when(
    parsers.parse(
        'the cluster is deployed again with version 2 of store "stock" beside version 1, held back'
    )
)
def second_deployment(deployment: Deployment) -> None:
    deployment.deploy(AFTER)


@when("every product is looked up continuously through both instances")
def look_up(deployment: Deployment) -> None:
    deployment.load = threading.Thread(target=_look_up_continuously, args=(deployment,))
    deployment.load.start()


@then('GET /stores shows version 1 of "stock" serving and version 2 building')
def building(deployment: Deployment) -> None:
    for member in deployment.members:
        stock = _stores(member)["stock"]
        assert stock["version"] == 1, stock
        assert _states(member) == {1: "serving", 2: "building"}, stock


@then("the lookups answer version 1's values")
def old_values(deployment: Deployment) -> None:
    wait_until(lambda: len(deployment.answers) >= 4 * PRODUCTS, lambda: "too few lookups")
    seen = list(deployment.answers)
    wrong = [a for a in seen if a.status != 200 or a.value != v1(a.key)]
    assert not wrong, wrong[:5]


@when("version 2 is let build")
def let_build(deployment: Deployment) -> None:
    deployment.gate.touch()


@then('"foldstream versions" follows the build until version 2 answers')
def watched(deployment: Deployment) -> None:
    foldstream = Path(sys.executable).with_name("foldstream")
    command = [str(foldstream), "versions", deployment.members[1].url, "stock"]
    done = subprocess.run(
        [*command, "--timeout", str(SWITCH_S)],
        capture_output=True,
        text=True,
        timeout=SWITCH_S + 60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "version 2 answers 'stock'" in done.stdout, done.stdout


@then('GET /stores shows version 2 of "stock" serving and version 1 retired, on both instances')
def switched(deployment: Deployment) -> None:
    for member in deployment.members:
        wait_until(
            lambda member=member: _states(member) == {1: "retired", 2: "serving"},
            lambda member=member: f"{member.url}/stores: {_stores(member)['stock']}",
            timeout=SWITCH_S,
        )
        assert _stores(member)["stock"]["version"] == 2


@then(
    "every lookup answered 200 with version 1's or version 2's value, never version 1's after "
    "version 2's on one instance"
)
def no_wrong_answer(deployment: Deployment) -> None:
    switched_at = len(deployment.answers)
    answers = _stop_load_after(deployment, 4 * PRODUCTS)
    wrong = [a for a in answers if a.status != 200 or a.value not in (v1(a.key), v2(a.key))]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers wrong or missing: {wrong[:5]}"
    new_seen: set[str | None] = set()
    for answer in answers:
        if answer.value == v2(answer.key):
            new_seen.add(answer.instance)
        else:
            assert answer.instance not in new_seen, f"version 1 again after version 2: {answer}"
    # (but one lookup may have been under way when both said they switched)
    assert all(a.value == v2(a.key) for a in answers[switched_at + 1 :])
    assert len(new_seen) == 2, f"version 2 answered by {new_seen} only"


def _stop_load_after(deployment: Deployment, more: int) -> list[Answer]:
    """Every answer of the lookup load, stopped once ``more`` answers came after now."""
    now = len(deployment.answers)
    wait_until(lambda: len(deployment.answers) >= now + more, lambda: "too few lookups")
    deployment.stop_load.set()
    assert deployment.load is not None
    deployment.load.join(timeout=30)
    return deployment.answers


@then("version 1's changelog and dead-letter topics and state directories are gone")
def old_version_gone(deployment: Deployment) -> None:
    _replaced(deployment, "stock", OLD_TOPICS, "stock.v2")


def _replaced(deployment: Deployment, old: str, topics: tuple[str, ...], new: str) -> None:
    """Store ``old``'s ``topics`` and directories are gone, marked retired; ``new``'s are kept."""
    admin = admin_client(deployment.bootstrap)
    wait_until(
        lambda: all(topic_partitions(admin, t) is None for t in topics),
        lambda: f"{[t for t in topics if topic_partitions(admin, t) is not None]} remain",
    )
    for member in deployment.members:
        state = member.state_dir
        wait_until(
            lambda state=state: not (state / "stores" / old).exists(),
            lambda state=state: f"{state / 'stores' / old} remains",
        )
        assert (state / "stores" / new).is_dir()
        assert (state / "retired" / old).exists()


@when(parsers.parse('product "sku-3" is sent "receive_shipment" with quantity 5'))
def command_after_switch(deployment: Deployment) -> None:
    url = deployment.members[1].url
    status, body = http("POST", f"{url}/commands/product/sku-3/receive_shipment", {"quantity": 5})
    assert status == 200, body
    deployment.token = body["token"]


@then(parsers.parse("looking it up with the command's token answers version 2's value {expected}"))
def token_lookup(deployment: Deployment, expected: str) -> None:
    token = urllib.parse.quote(deployment.token, safe="")
    for member in deployment.members:
        status, body = http("GET", f"{member.url}/stores/stock/keys/sku-3?{PARAM}={token}")
        assert (status, body.get("value")) == (200, json.loads(expected)), body


@when("one instance is restarted")
def restart_one(deployment: Deployment) -> None:
    deployment.members[0].stop()
    deployment.members[0] = deployment.start(AFTER, 1)
    deployment.members[0].wait_ready(timeout=300)


@then('it answers "stock" with version 2 at once, and version 1\'s topics are not created again')
def restarted(deployment: Deployment) -> None:
    member = deployment.members[0]
    stock = _stores(member)["stock"]
    assert stock["version"] == 2 and _states(member) == {1: "retired", 2: "serving"}, stock
    admin = admin_client(deployment.bootstrap)
    assert all(topic_partitions(admin, t) is None for t in OLD_TOPICS)
    wait_cluster_stable(deployment.members, timeout=300)
    for n in range(PRODUCTS):
        status, body = http("GET", f"{member.url}/stores/stock/keys/sku-{n}")
        expected = {"on_hand": 8, "moves": 4} if n == 3 else v2(n)
        assert (status, body.get("value")) == (200, expected), body


# -- rebuilding version 2 on demand ------------------------------------------------------------

#: Version 2's topics, which go once its rebuild answers.
V2_TOPICS = ("versioned.stock.v2.changelog", "versioned.stock.v2.dlq")
REBUILT = "stock.v2.r1"


def rebuilt_value(n: int) -> dict[str, int]:
    """Version 2's value of ``sku-n`` after the command of the scenario (the rebuild folds the
    same)."""
    return {"on_hand": 8, "moves": 4} if n == 3 else v2(n)


def _ranked_states(member: InstanceProcess) -> dict[tuple[int, int], str]:
    versions = _stores(member)["stock"]["versions"]
    return {(v["version"], v["generation"]): v["state"] for v in versions}


@when("every product is looked up continuously again through both instances")
def look_up_again(deployment: Deployment) -> None:
    deployment.answers = []
    deployment.stop_load.clear()
    look_up(deployment)
    wait_until(lambda: len(deployment.answers) >= PRODUCTS, lambda: "no lookups")


@when(parsers.parse('"foldstream rebuild" is run for "{store}"'), target_fixture="rebuild_run")
def run_rebuild(deployment: Deployment, store: str) -> subprocess.CompletedProcess[str]:
    foldstream = Path(sys.executable).with_name("foldstream")
    command = [str(foldstream), "rebuild", deployment.members[1].url, store]
    return subprocess.run(
        [*command, "--timeout", str(SWITCH_S)],
        capture_output=True,
        text=True,
        timeout=SWITCH_S + 60,
    )


@then("it follows the rebuild until version 2 rebuild 1 answers, and exits 0")
def rebuild_followed(rebuild_run: subprocess.CompletedProcess[str]) -> None:
    out = rebuild_run.stdout
    assert rebuild_run.returncode == 0, out + rebuild_run.stderr
    assert "rebuilding version 2 of 'stock' as generation 1" in out, out
    assert "version 2 rebuild 1 answers 'stock'" in out, out


@then(
    'GET /stores shows version 2 rebuild 1 of "stock" serving and version 2 retired, on both '
    "instances"
)
def rebuilt(deployment: Deployment) -> None:
    wanted = {(1, 0): "retired", (2, 0): "retired", (2, 1): "serving"}
    for member in deployment.members:
        wait_until(
            lambda member=member: _ranked_states(member) == wanted,
            lambda member=member: f"{member.url}/stores: {_stores(member)['stock']}",
            timeout=SWITCH_S,
        )
        stock = _stores(member)["stock"]
        assert (stock["version"], stock["generation"]) == (2, 1), stock


@then("every lookup during the rebuild answered 200 with version 2's value")
def rebuild_answers(deployment: Deployment) -> None:
    answers = _stop_load_after(deployment, 4 * PRODUCTS)
    wrong = [a for a in answers if a.status != 200 or a.value != rebuilt_value(a.key)]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers wrong or missing: {wrong[:5]}"


@then("version 2's changelog and dead-letter topics and state directories are gone")
def version_2_gone(deployment: Deployment) -> None:
    _replaced(deployment, "stock.v2", V2_TOPICS, REBUILT)


@when("the other instance is restarted")
def restart_other(deployment: Deployment) -> None:
    deployment.members[1].stop()
    deployment.members[1] = deployment.start(AFTER, 2)
    deployment.members[1].wait_ready(timeout=300)


@then(
    'it answers "stock" with version 2 rebuild 1 at once, and version 2\'s topics are not '
    "created again"
)
def restarted_rebuilt(deployment: Deployment) -> None:
    member = deployment.members[1]
    stock = _stores(member)["stock"]
    assert (stock["version"], stock["generation"]) == (2, 1), stock
    admin = admin_client(deployment.bootstrap)
    assert all(topic_partitions(admin, t) is None for t in V2_TOPICS)
    wait_cluster_stable(deployment.members, timeout=300)
    for n in range(PRODUCTS):
        status, body = http("GET", f"{member.url}/stores/stock/keys/sku-{n}")
        assert (status, body.get("value")) == (200, rebuilt_value(n)), body
