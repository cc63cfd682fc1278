"""One member of the membership bench (:mod:`bench.membership`), in a process of its own:
``python -m bench.membership_member DESIGN INDEX BOOTSTRAP SERVICE STATE_DIR SESSION_MS``.

It builds everything first, says ``ready``, and starts only when a line arrives on stdin, so
that members started together start within milliseconds of each other, whatever importing and
connecting cost each. ``DESIGN`` is

- ``homemade``: foldstream's own membership, the :class:`~foldstream.cluster.node.ClusterNode`
  an instance runs, with no store (nothing to restore or copy: a takeover is immediate) and the
  partition writers of :mod:`bench.membership_writers` as its command side;
- ``kip848``: a member of a consumer group of Kafka's own protocol (``group.protocol=consumer``)
  subscribed to the events topic: the broker's assignment is what it owns (incremental assign
  and revoke callbacks drive the same writers), and its view of the others comes from
  describing the group (``ConsumerGroupDescribe``) every heartbeat interval, the source a
  foldstream built on it would route by.

Its member id is ``m<INDEX>`` (the client id, in the group). What it owns and sees is reported on
stdout (:class:`~bench.membership_writers.Reporter`), its log on stderr.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from bench.membership_writers import PartitionWriters, Reporter
from foldstream.broker import free_port
from foldstream.changelog import StandbyReplicas
from foldstream.cluster.node import ClusterNode
from foldstream.process import exit_with_parent
from foldstream.settings import Settings
from foldstream.state.local import LocalStores

PARTITIONS = 6
#: How often the KIP-848 member describes its group: the heartbeat interval both designs use.
DESCRIBE_EVERY_S = 0.5
#: How often the home-made member reads its cluster map's owners (they change on its thread).
VIEW_EVERY_S = 0.05

log = logging.getLogger("bench.membership")


class NoProjections:
    """The projections of a service without stores: nothing to run."""

    def run(self, owned: Mapping[str, Iterable[int]]) -> None:
        pass

    def failure(self, counts: Callable[[str], bool] = lambda _: True) -> str | None:
        return None

    def retire(self, store: str) -> None:
        pass


def member_index(member_id: str | None) -> int | None:
    """``m3`` -> 3; None for no member (or one that is not of this bench)."""
    if member_id is None or not member_id.startswith("m") or not member_id[1:].isdigit():
        return None
    return int(member_id[1:])


def homemade(index: int, settings: Settings, report: Reporter, go: threading.Event) -> None:
    writers = PartitionWriters(
        bootstrap=settings.bootstrap_servers,
        service=settings.service,
        topic=f"{settings.service}.writes",
        report=report,
    )
    replicas = StandbyReplicas(
        bootstrap=settings.bootstrap_servers, state_dir=settings.state_dir, layouts={}
    )
    node = ClusterNode(
        settings=settings,
        member_id=f"m{index}",
        stores={},
        topics={settings.events_topic: PARTITIONS},
        store_info={},
        local=LocalStores(settings.state_dir),
        replicas=replicas,
        projections=NoProjections(),
        commands=writers,
        ends={},
    )
    report.say("ready")
    go.wait()
    threading.Thread(target=node.start, daemon=True).start()
    seen: dict[int, int | None] = {}
    while True:
        owners = {}
        for p in range(PARTITIONS):
            owner = node.map.active_owner(settings.events_topic, p)
            owners[p] = member_index(owner.id if owner else None)
        if owners != seen:
            report.owners(owners)
            seen = owners
        time.sleep(VIEW_EVERY_S)


def kip848(index: int, settings: Settings, report: Reporter, go: threading.Event) -> None:
    writers = PartitionWriters(
        bootstrap=settings.bootstrap_servers,
        service=settings.service,
        topic=f"{settings.service}.writes",
        report=report,
    )
    owned: set[int] = set()

    def gained(consumer: Any, partitions: list[Any]) -> None:
        owned.update(tp.partition for tp in partitions)
        writers.own(owned)

    def revoked(consumer: Any, partitions: list[Any]) -> None:
        owned.difference_update(tp.partition for tp in partitions)
        writers.own(owned)

    def lost(consumer: Any, partitions: list[Any]) -> None:
        log.warning("lost %s: this member was fenced", [p.partition for p in partitions])
        revoked(consumer, partitions)

    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": settings.service,
            "group.protocol": "consumer",
            "client.id": f"m{index}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 500,
        }
    )
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    report.say("ready")
    go.wait()
    consumer.subscribe([settings.events_topic], on_assign=gained, on_revoke=revoked, on_lost=lost)
    view = threading.Thread(target=_describe_loop, args=(admin, settings.service, report))
    view.daemon = True
    view.start()
    while True:
        consumer.poll(0.1)  # the callbacks run here; the topic has no records


def _describe_loop(admin: AdminClient, group: str, report: Reporter) -> None:
    """The group's owner of each partition, from the coordinator, every heartbeat interval."""
    seen: dict[int, int | None] = {}
    while True:
        started = time.monotonic()
        try:
            described = admin.describe_consumer_groups([group])[group].result(timeout=5)
        except Exception as exc:  # noqa: BLE001 - a timeout too: the next round asks again
            log.warning("describing the group failed: %s", exc)
        else:
            owners: dict[int, int | None] = dict.fromkeys(range(PARTITIONS))
            for member in described.members:
                for tp in member.assignment.topic_partitions:
                    owners[tp.partition] = member_index(member.client_id)
            if owners != seen:
                report.owners(owners)
                seen = owners
        time.sleep(max(0.0, DESCRIBE_EVERY_S - (time.monotonic() - started)))


def main(argv: list[str]) -> None:
    design, index, bootstrap, service, state_dir, session_ms = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    exit_with_parent()
    settings = Settings(
        service=service,
        bootstrap_servers=bootstrap,
        state_dir=Path(state_dir),
        partitions=PARTITIONS,
        session_timeout_ms=int(session_ms),
        port=free_port(),
    )
    go = threading.Event()

    def wait_for_go() -> None:
        sys.stdin.readline()
        go.set()

    threading.Thread(target=wait_for_go, daemon=True).start()
    run = {"homemade": homemade, "kip848": kip848}[design]
    run(int(index), settings, Reporter(), go)


if __name__ == "__main__":
    main(sys.argv[1:])
