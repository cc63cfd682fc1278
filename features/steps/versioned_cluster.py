"""The versioned service's cluster for the version and rebuild features: two instances of
``foldstream.testing.versioned`` (a version's fold held back at a gate file until the feature
lets it build), a continuous lookup load through both, and checks of a replaced store."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foldstream.kafka_client import admin_client
from foldstream.kafka_topics import topic_partitions
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.testing.scenario import wait_until
from foldstream.testing.versioned import GATE_ENV

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
    rebuild: subprocess.Popen[str] | None = None

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
        if self.rebuild is not None and self.rebuild.poll() is None:
            self.rebuild.kill()
            self.rebuild.wait(timeout=30)
        for member in self.members:
            member.stop()


def look_up_continuously(deployment: Deployment) -> None:
    n = 0
    while not deployment.stop_load.is_set():
        member = deployment.members[n % 2]
        key = n % PRODUCTS
        status, body = http("GET", f"{member.url}/stores/stock/keys/sku-{key}", timeout=10)
        served_by = body.get("served_by", {}) if isinstance(body, dict) else {}
        value = body.get("value") if isinstance(body, dict) else body
        deployment.answers.append(Answer(key, status, value, served_by.get("instance")))
        n += 1


def stores_of(member: InstanceProcess) -> dict[str, Any]:
    status, body = http("GET", f"{member.url}/stores")
    assert status == 200, body
    return {s["name"]: s for s in body["stores"]}


def states_of(member: InstanceProcess) -> dict[int, str]:
    return {v["version"]: v["state"] for v in stores_of(member)["stock"]["versions"]}


def start_load(deployment: Deployment) -> None:
    """Look every product up, through both instances in turn, until the load is stopped."""
    deployment.stop_load.clear()
    deployment.load = threading.Thread(target=look_up_continuously, args=(deployment,))
    deployment.load.start()


def stop_load_after(deployment: Deployment, more: int) -> list[Answer]:
    """Every answer of the lookup load, stopped once ``more`` answers came after now."""
    now = len(deployment.answers)
    wait_until(lambda: len(deployment.answers) >= now + more, lambda: "too few lookups")
    deployment.stop_load.set()
    assert deployment.load is not None
    deployment.load.join(timeout=30)
    return deployment.answers


def replaced(deployment: Deployment, old: str, topics: tuple[str, ...], new: str) -> None:
    """Store ``old``'s ``topics`` and directories are gone, marked retired; ``new``'s are kept."""
    admin = admin_client(deployment.bootstrap)
    wait_until(
        lambda: all(topic_partitions(admin, t) is None for t in topics),
        lambda: f"{[t for t in topics if topic_partitions(admin, t) is not None]} remain",
    )
    dirs = [member.state_dir / "stores" / old for member in deployment.members]
    wait_until(
        lambda: not any(d.exists() for d in dirs),
        lambda: f"{[d for d in dirs if d.exists()]} remain",
    )
    for member in deployment.members:
        assert (member.state_dir / "stores" / new).is_dir()
        assert (member.state_dir / "retired" / old).exists()
