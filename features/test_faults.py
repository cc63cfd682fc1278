"""Broker faults recover without a restart (a cluster on a broker of its own, paused with
SIGSTOP: nothing else in the session uses it)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess, wait_cluster_stable
from foldstream.testing.cluster_checks import commands_fold_everywhere
from foldstream.testing.steps import REQUEST_ERRORS

scenarios("faults.feature")

SERVICE = "foldstream.examples.inventory:service"


@dataclass
class Faults:
    broker: KafkaCluster | None = None
    members: list[InstanceProcess] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    resumed_at: float = 0.0


@pytest.fixture
def faults(tmp_path: Path) -> Iterator[Faults]:
    state = Faults()
    yield state
    for member in state.members:
        member.stop()
    if state.broker is not None:
        if state.broker.pid is not None:
            os.kill(state.broker.pid, signal.SIGCONT)
        state.broker.stop()


def _post(url: str, arguments: dict[str, int]) -> tuple[int, Message]:
    """A command, following up to 3 redirects to the owner; its status and headers."""
    data = json.dumps(arguments).encode()
    for hop in range(4):
        request = urllib.request.Request(url, data=data, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.headers
        except urllib.error.HTTPError as exc:
            if exc.code != 307 or hop == 3:
                return exc.code, exc.headers
            url = exc.headers["Location"]
    raise AssertionError("unreachable")


@given("a cluster of 2 instances of the inventory example on a broker of its own")
def own_cluster(faults: Faults, tmp_path: Path, foldstream_partitions: int) -> None:
    faults.broker = KafkaCluster(data_dir=tmp_path / "kafka").start()
    faults.members = [
        InstanceProcess(
            bootstrap=faults.broker.bootstrap,
            state_dir=tmp_path / f"member-{n}",
            service=SERVICE,
            partitions=foldstream_partitions,
        ).start()
        for n in range(2)
    ]
    for member in faults.members:
        member.wait_ready()
    wait_cluster_stable(faults.members)


@when(
    parsers.parse(
        "the broker stands still for {seconds:d} seconds while a client keeps sending commands"
    )
)
def broker_stands_still(faults: Faults, seconds: int) -> None:
    assert faults.broker is not None and faults.broker.pid is not None
    stop = threading.Event()

    def send() -> None:
        n = 0
        while not stop.is_set():
            member = faults.members[n % 2]
            url = f"{member.url}/commands/product/pause-{n % 16}/receive_shipment"
            try:
                status, headers = _post(url, {"quantity": 1})
            except REQUEST_ERRORS as exc:
                faults.answers[f"error {type(exc).__name__}"] += 1
            else:
                retry = status == 503 and headers.get("Retry-After", "").isdigit()
                faults.answers["503" if retry else str(status)] += 1
            n += 1
            time.sleep(0.05)

    sender = threading.Thread(target=send, daemon=True)
    os.kill(faults.broker.pid, signal.SIGSTOP)
    sender.start()
    try:
        time.sleep(seconds)  # the fault itself lasts this long: there is no condition to await
    finally:
        os.kill(faults.broker.pid, signal.SIGCONT)
        faults.resumed_at = time.monotonic()
        stop.set()
        sender.join(timeout=120)


@then("every command sent meanwhile answered 200, or 503 with Retry-After")
def answered_or_unavailable(faults: Faults) -> None:
    assert faults.answers, "no command was sent"
    assert set(faults.answers) <= {"200", "503"}, faults.answers
    assert faults.answers["503"] > 0, f"the pause went unnoticed: {faults.answers}"


@then(
    parsers.parse(
        "within {seconds:d} seconds of the broker's return a command on every partition is "
        "folded and answered from every instance"
    )
)
def recovered(faults: Faults, foldstream_partitions: int, seconds: int) -> None:
    commands_fold_everywhere(
        faults.members,
        aggregate="product",
        command="receive_shipment",
        arguments={"quantity": 2},
        store="stock",
        value={"on_hand": 2},
        partitions=foldstream_partitions,
        prefix="after-pause-",
        retry_for=max(0.0, faults.resumed_at + seconds - time.monotonic()),
    )


@then("both instances become ready again")
def ready_again(faults: Faults) -> None:
    for member in faults.members:
        member.wait_ready(timeout=60)
