"""Instances started together (a deployment): one assignment, never two owners of a partition.

Each round starts fresh instances (new state directories and member ids) of the inventory
example on the session's broker, checks them, and stops them before the next round.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pytest_bdd import parsers, scenarios, then, when

from foldstream.broker import KafkaCluster
from foldstream.cluster.map import ASSIGNMENT_KEY
from foldstream.cluster.records import InvalidRecord, MemberState
from foldstream.kafka import read_to_end, topic_partitions
from foldstream.process import InstanceProcess, wait_cluster_stable
from foldstream.settings import Settings
from foldstream.testing.cluster_checks import commands_fold_everywhere
from foldstream.testing.kafka import log_ends

scenarios("startup.feature")

SERVICE = "foldstream.examples.inventory:service"


class Round:
    """The instances of one round and where the cluster topic stood before they started."""

    def __init__(self) -> None:
        self.members: list[InstanceProcess] = []
        self.cluster_from = 0


@pytest.fixture
def startup_round() -> Iterator[Round]:
    started = Round()
    yield started
    for member in started.members:
        member.stop()


@when(parsers.parse("{size:d} fresh instances of the service are started at the same moment"))
def start_together(
    broker: KafkaCluster,
    tmp_path: Path,
    foldstream_partitions: int,
    startup_round: Round,
    size: int,
) -> None:
    topic = Settings(service="inventory").cluster_topic
    ends = log_ends(broker.bootstrap, topic, 1) if _exists(broker, topic) else {0: 0}
    startup_round.cluster_from = ends.get(0, 0)
    startup_round.members = [
        InstanceProcess(
            bootstrap=broker.bootstrap,
            state_dir=tmp_path / f"member-{n}",
            service=SERVICE,
            partitions=foldstream_partitions,
        )
        for n in range(size)
    ]
    for member in startup_round.members:  # one after another, without waiting
        member.start()
    for member in startup_round.members:
        member.wait_ready()


def _exists(broker: KafkaCluster, topic: str) -> bool:
    return topic_partitions(AdminClient({"bootstrap.servers": broker.bootstrap}), topic) is not None


@then("they converge to one assignment in which every partition has one live owner")
def converged(startup_round: Round) -> None:
    wait_cluster_stable(startup_round.members)


@then("no two of them ever claimed one partition, as the cluster topic records it")
def never_two_owners(broker: KafkaCluster, startup_round: Round) -> None:
    """Replays the cluster topic from where it stood before the round, in log order: after every
    record, no partition is claimed (active or restoring) by two of this round's members."""
    ids = {_member_id(m) for m in startup_round.members}
    topic = Settings(service="inventory").cluster_topic
    latest: dict[str, MemberState] = {}
    for batch in read_to_end(broker.bootstrap, topic, 1):
        for message in batch:
            if message.offset() < startup_round.cluster_from or message.key() == ASSIGNMENT_KEY:
                continue
            member_id = message.key().decode()
            if member_id not in ids:
                continue
            try:
                latest[member_id] = MemberState.from_json(message.value())
            except InvalidRecord:
                latest.pop(member_id, None)  # a tombstone: it left
                continue
            claims: dict[tuple[str, int], str] = {}
            for state in latest.values():
                for claimed in (state.active, state.restoring):
                    for events_topic, partitions in claimed.items():
                        for p in partitions:
                            other = claims.setdefault((events_topic, p), state.id)
                            assert other == state.id, (
                                f"at offset {message.offset()} of {topic}, {events_topic}/{p} is "
                                f"claimed by {other} and {state.id}"
                            )
    assert set(latest) == ids, f"records of {sorted(ids - set(latest))} are missing"


def _member_id(member: InstanceProcess) -> str:
    return (member.state_dir / "instance-id").read_text().strip()


@then("a command on every partition is folded and answered from every instance")
def every_partition_folds(startup_round: Round, foldstream_partitions: int) -> None:
    commands_fold_everywhere(
        startup_round.members,
        aggregate="product",
        command="receive_shipment",
        arguments={"quantity": 3},
        store="stock",
        value={"on_hand": 3},
        partitions=foldstream_partitions,
        prefix="start-",
    )
