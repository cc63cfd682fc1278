"""Steps of the rebuild part of features/versions.feature: ``foldstream rebuild`` of the version
answering, on the versioned service's cluster (:mod:`features.steps.versioned_cluster`), under
the lookup load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest_bdd import parsers, then, when

from foldstream.kafka_client import admin_client
from foldstream.kafka_topics import topic_partitions
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.testing.scenario import wait_until

from .versioned_cluster import (
    AFTER,
    PRODUCTS,
    SWITCH_S,
    Deployment,
    replaced,
    start_load,
    stop_load_after,
    stores_of,
    v2,
)

#: Version 2's topics, which go once its rebuild answers.
V2_TOPICS = ("versioned.stock.v2.changelog", "versioned.stock.v2.dlq")
REBUILT = "stock.v2.r1"


def rebuilt_value(n: int) -> dict[str, int]:
    """Version 2's value of ``sku-n`` after the command of the scenario (the rebuild folds the
    same)."""
    return {"on_hand": 8, "moves": 4} if n == 3 else v2(n)


def _ranked_states(member: InstanceProcess) -> dict[tuple[int, int], str]:
    versions = stores_of(member)["stock"]["versions"]
    return {(v["version"], v["generation"]): v["state"] for v in versions}


def _await_states(deployment: Deployment, wanted: dict[tuple[int, int], str]) -> None:
    """Wait until every member says ``wanted`` of the versions of "stock"."""
    wait_until(
        lambda: all(_ranked_states(member) == wanted for member in deployment.members),
        lambda: f"{[stores_of(member)['stock'] for member in deployment.members]}",
        timeout=SWITCH_S,
    )


@when("every product is looked up continuously again through both instances")
def look_up_again(deployment: Deployment) -> None:
    deployment.answers = []
    start_load(deployment)
    wait_until(lambda: len(deployment.answers) >= PRODUCTS, lambda: "no lookups")


def _rebuild_command(deployment: Deployment, store: str) -> list[str]:
    foldstream = Path(sys.executable).with_name("foldstream")
    url = deployment.members[1].url
    return [str(foldstream), "rebuild", url, store, "--timeout", str(SWITCH_S)]


@when("version 2's fold is held back again")
def hold_back(deployment: Deployment) -> None:
    deployment.gate.unlink()


@when(parsers.parse('"foldstream rebuild" is started for "{store}"'))
def start_rebuild(deployment: Deployment, store: str) -> None:
    command = _rebuild_command(deployment, store)
    deployment.rebuild = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@then(
    'GET /stores shows version 2 rebuild 1 of "stock" building and version 2 serving, on both '
    "instances"
)
def rebuild_building(deployment: Deployment) -> None:
    _await_states(deployment, {(1, 0): "retired", (2, 0): "serving", (2, 1): "building"})


@when("the rebuild is let build")
def let_rebuild(deployment: Deployment) -> None:
    deployment.gate.touch()


@then(
    parsers.parse('"foldstream rebuild" of store "{store}" exits 2 with one error line naming it')
)
def rebuild_refused(deployment: Deployment, store: str) -> None:
    done = subprocess.run(
        _rebuild_command(deployment, store), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], done.stderr
    assert f"no store named {store!r}" in lines[-1] and "Traceback" not in done.stderr


@then("it follows the rebuild until version 2 rebuild 1 answers, and exits 0")
def rebuild_followed(deployment: Deployment) -> None:
    assert deployment.rebuild is not None
    out, err = deployment.rebuild.communicate(timeout=SWITCH_S + 60)
    assert deployment.rebuild.returncode == 0, out + err
    assert "rebuilding version 2 of 'stock' as generation 1" in out, out
    assert "version 2 rebuild 1 answers 'stock'" in out, out


@then(
    'GET /stores shows version 2 rebuild 1 of "stock" serving and version 2 retired, on both '
    "instances"
)
def rebuilt(deployment: Deployment) -> None:
    _await_states(deployment, {(1, 0): "retired", (2, 0): "retired", (2, 1): "serving"})
    for member in deployment.members:
        stock = stores_of(member)["stock"]
        assert (stock["version"], stock["generation"]) == (2, 1), stock


@then("every lookup during the rebuild answered 200 with version 2's value")
def rebuild_answers(deployment: Deployment) -> None:
    answers = stop_load_after(deployment, 4 * PRODUCTS)
    wrong = [a for a in answers if a.status != 200 or a.value != rebuilt_value(a.key)]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers wrong or missing: {wrong[:5]}"


@then("version 2's changelog and dead-letter topics and state directories are gone")
def version_2_gone(deployment: Deployment) -> None:
    replaced(deployment, "stock.v2", V2_TOPICS, REBUILT)


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
    stock = stores_of(member)["stock"]
    assert (stock["version"], stock["generation"]) == (2, 1), stock
    admin = admin_client(deployment.bootstrap)
    assert all(topic_partitions(admin, t) is None for t in V2_TOPICS)
    wait_cluster_stable(deployment.members, timeout=300)
    for n in range(PRODUCTS):
        status, body = http("GET", f"{member.url}/stores/stock/keys/sku-{n}")
        assert (status, body.get("value")) == (200, rebuilt_value(n)), body
