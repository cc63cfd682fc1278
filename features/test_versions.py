"""Versions of a store on a real cluster: two instances of ``foldstream.testing.versioned``,
first deployed with version 1 of ``stock`` alone, then with version 2 beside it (held back at a
gate file until the feature lets it build), under a continuous lookup load."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from features.steps.versioned_cluster import (
    AFTER,
    BEFORE,
    OLD_TOPICS,
    PRODUCTS,
    SWITCH_S,
    Deployment,
    replaced,
    start_load,
    states_of,
    stop_load_after,
    stores_of,
    v1,
    v2,
)
from foldstream.broker import KafkaCluster
from foldstream.kafka_client import admin_client
from foldstream.kafka_topics import topic_partitions
from foldstream.process import http, wait_cluster_stable
from foldstream.testing.scenario import wait_until
from foldstream.tokens import PARAM

scenarios("versions.feature")


@pytest.fixture
def deployment(
    broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("versioned")
    running = Deployment(root, broker.bootstrap, root / "gate")
    try:
        yield running
    finally:
        running.close()


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
    start_load(deployment)


@then('GET /stores shows version 1 of "stock" serving and version 2 building')
def building(deployment: Deployment) -> None:
    for member in deployment.members:
        stock = stores_of(member)["stock"]
        assert stock["version"] == 1, stock
        assert states_of(member) == {1: "serving", 2: "building"}, stock


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
            lambda member=member: states_of(member) == {1: "retired", 2: "serving"},
            lambda member=member: f"{member.url}/stores: {stores_of(member)['stock']}",
            timeout=SWITCH_S,
        )
        assert stores_of(member)["stock"]["version"] == 2


@then(
    "every lookup answered 200 with version 1's or version 2's value, never version 1's after "
    "version 2's on one instance"
)
def no_wrong_answer(deployment: Deployment) -> None:
    switched_at = len(deployment.answers)
    answers = stop_load_after(deployment, 4 * PRODUCTS)
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


@then("version 1's changelog and dead-letter topics and state directories are gone")
def old_version_gone(deployment: Deployment) -> None:
    replaced(deployment, "stock", OLD_TOPICS, "stock.v2")


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
    stock = stores_of(member)["stock"]
    assert stock["version"] == 2 and states_of(member) == {1: "retired", 2: "serving"}, stock
    admin = admin_client(deployment.bootstrap)
    assert all(topic_partitions(admin, t) is None for t in OLD_TOPICS)
    wait_cluster_stable(deployment.members, timeout=300)
    for n in range(PRODUCTS):
        status, body = http("GET", f"{member.url}/stores/stock/keys/sku-{n}")
        expected = {"on_hand": 8, "moves": 4} if n == 3 else v2(n)
        assert (status, body.get("value")) == (200, expected), body
