"""Broker faults recover without a restart, and an instance that lost its view of the cluster
meanwhile stops acting as an owner (a cluster on a broker of its own, paused with SIGSTOP:
nothing else in the session uses it)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.testing.cluster_checks import commands_fold_everywhere
from foldstream.testing.query_load import request
from foldstream.testing.steps import REQUEST_ERRORS, wait_until

scenarios("faults.feature")

SERVICE = "foldstream.examples.inventory:service"


@dataclass(frozen=True)
class Answer:
    """One request sent while the broker stood still: when, to which instance, what it was
    (``command``, ``read`` or ``read any``: with ``max_lag=any``), and its answer."""

    sent_at: float
    member: str
    kind: str
    status: int
    retry_after: bool  # a Retry-After of whole seconds
    body: Any


@dataclass
class Faults:
    broker: KafkaCluster | None = None
    members: list[InstanceProcess] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # of the products read
    answers: list[Answer] = field(default_factory=list)
    stalled_at: float = 0.0
    resumed_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, answer: Answer) -> None:
        with self.lock:
            self.answers.append(answer)

    def after_session_timeout(self, kind: str) -> list[Answer]:
        """The ``kind`` requests sent once every instance's view had to be out of date: the
        session timeout after the broker stopped (no own beat sent later can be read back)."""
        since = self.stalled_at + self.members[0].session_timeout_ms / 1000
        found = [a for a in self.answers if a.kind == kind and a.sent_at >= since]
        assert found, (
            f"no {kind} sent after the session timeout: {Counter(a.kind for a in self.answers)}"
        )
        return found


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


def _request(
    url: str, data: bytes | None = None, *, follow: bool = True
) -> tuple[int, Message, Any]:
    """A request (a POST with ``data``), following up to 3 redirects unless ``follow`` is
    false: its status, headers and JSON body."""
    for _ in range(4):
        status, headers, body = request(url, data, timeout=60)
        if status != 307 or not follow:
            break
        url = headers["Location"]
    return status, headers, body


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


@given(
    parsers.parse(
        'products "still-1" to "still-{last:d}" accepted "receive_shipment" with '
        '{{"quantity": <n>}}, every copy caught up'
    )
)
def products_everywhere(faults: Faults, last: int) -> None:
    """Each answered with its value by every instance, and every standby copy caught up."""
    for n in range(1, last + 1):
        url = f"{faults.members[n % 2].url}/commands/product/still-{n}/receive_shipment"
        status, _, body = _request(url, json.dumps({"quantity": n}).encode())
        assert status == 200, body
        faults.values[f"still-{n}"] = {"on_hand": n}
    for member in faults.members:
        for key, value in faults.values.items():
            url = f"{member.url}/stores/stock/keys/{key}"
            wait_until(lambda u=url, v=value: _request(u)[2].get("value") == v, lambda u=url: u)  # type: ignore[misc]
    wait_cluster_stable(faults.members)  # every partition's standby copy 0 records behind


@when(
    parsers.parse(
        "the broker stands still for {seconds:d} seconds while a client keeps sending commands "
        "and reading those products"
    )
)
def broker_stands_still(faults: Faults, seconds: int) -> None:
    """Commands (one every 0.2 s, each in a thread of its own: one may wait for Kafka for its
    transaction timeout) and reads of the products, with and without ``max_lag=any``."""
    assert faults.broker is not None and faults.broker.pid is not None
    stop = threading.Event()
    commands: list[threading.Thread] = []

    def command(n: int) -> None:
        member = faults.members[n % 2].url
        url = f"{member}/commands/product/pause-{n % 16}/receive_shipment"
        sent = time.monotonic()
        try:
            status, headers, body = _request(url, b'{"quantity": 1}')
        except REQUEST_ERRORS as exc:
            status, headers, body = 0, Message(), repr(exc)
        faults.note(Answer(sent, member, "command", status, _retry_after(headers), body))

    def read() -> None:
        while not stop.is_set():
            for member in faults.members:
                for key in faults.values:
                    for kind, query in (("read", ""), ("read any", "?max_lag=any")):
                        url = f"{member.url}/stores/stock/keys/{key}{query}"
                        sent = time.monotonic()
                        try:
                            status, headers, body = _request(url, follow=False)
                        except REQUEST_ERRORS as exc:
                            status, headers, body = 0, Message(), repr(exc)
                        faults.note(
                            Answer(sent, member.url, kind, status, _retry_after(headers), body)
                        )
            time.sleep(0.05)

    reader = threading.Thread(target=read, daemon=True)
    os.kill(faults.broker.pid, signal.SIGSTOP)
    faults.stalled_at = time.monotonic()
    reader.start()
    try:
        for n in range(seconds * 5):  # the fault lasts this long: there is no condition to await
            commands.append(threading.Thread(target=command, args=(n,), daemon=True))
            commands[-1].start()
            time.sleep(0.2)
    finally:
        os.kill(faults.broker.pid, signal.SIGCONT)
        faults.resumed_at = time.monotonic()
        stop.set()
        reader.join(timeout=120)
        for thread in commands:
            thread.join(timeout=120)


def _retry_after(headers: Message) -> bool:
    return headers.get("Retry-After", "").isdigit()


@then("every command sent meanwhile answered 200, or 503 with Retry-After")
def answered_or_unavailable(faults: Faults) -> None:
    answers = Counter(
        "503" if a.status == 503 and a.retry_after else str(a.status)
        for a in faults.answers
        if a.kind == "command"
    )
    assert answers, "no command was sent"
    assert set(answers) <= {"200", "503"}, answers
    assert answers["503"] > 0, f"the pause went unnoticed: {answers}"


@then(
    "once the session timeout had passed, every command answered 503 with Retry-After for a "
    "view that is not current"
)
def commands_refused(faults: Faults) -> None:
    for answer in faults.after_session_timeout("command"):
        assert answer.status == 503 and answer.retry_after, answer
        assert "view of the cluster is not current" in answer.body["error"], answer


@then(
    "once the session timeout had passed, every read without max_lag answered 503 with Retry-After"
)
def reads_refused(faults: Faults) -> None:
    for answer in faults.after_session_timeout("read"):
        assert answer.status == 503 and answer.retry_after, answer
        assert "view of the cluster is not current" in answer.body["error"], answer


@then(
    "once the session timeout had passed, every read with max_lag=any was answered by the "
    "instance asked from a copy of unknown lag, with the product's value"
)
def reads_of_unknown_lag(faults: Faults) -> None:
    ids = {
        m["url"]: m["id"] for m in http("GET", f"{faults.members[0].url}/cluster")[1]["instances"]
    }
    roles: Counter[str] = Counter()
    for answer in faults.after_session_timeout("read any"):
        assert answer.status == 200, answer
        served = answer.body["served_by"]
        assert served["instance"] == ids[answer.member] and served["lag"] is None, answer
        assert answer.body["value"] == faults.values[answer.body["key"]], answer
        roles[served["role"]] += 1
    # Each instance owns partitions and keeps a standby copy of the other's.
    assert set(roles) == {"unconfirmed", "standby"}, roles
    after = {kind: len(faults.after_session_timeout(kind)) for kind in ("command", "read")}
    print(f"\nsent once the views were out of date: {after}; read with max_lag=any: {roles}")


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
