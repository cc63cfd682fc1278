"""One nemesis run: a deployment, clients recording every operation, the nemesis injecting
faults for a while, then the events topic read and the history checked."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.table import Table

from foldstream.kafka import consumer_config
from tests.nemesis.checker import Event, Verdict, check, parse_event
from tests.nemesis.clients import Load
from tests.nemesis.deployment import Deployment
from tests.nemesis.faults import KINDS, Nemesis
from tests.nemesis.history import Clock, History
from tests.nemesis.network import Network

EVENTS_TOPIC = "inventory.events"


@dataclass
class Outcome:
    history: History
    verdict: Verdict
    events: int
    seconds: float


@contextlib.contextmanager
def deployed(root: Path, *, network: bool, **options: object) -> Iterator[Deployment]:
    """A started :class:`Deployment` (on hosts of its own with ``network``), stopped after."""
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(Network()) if network else None
        deployment = Deployment(root=root, network=net, **options)  # type: ignore[arg-type]
        stack.callback(deployment.stop)
        yield deployment.start()


def run(
    deployment: Deployment,
    *,
    seed: int,
    duration: float,
    kinds: Sequence[str] = KINDS,
    clients: int = 4,
    retry_commands: bool = False,
    each_once: bool = False,
) -> Outcome:
    """Load and faults on ``deployment`` for ``duration`` seconds (or, ``each_once``, one
    fault of each of ``kinds`` in turn), then the check."""
    began = time.monotonic()
    clock = Clock()
    load = Load(deployment.urls, clock, seed, clients=clients, retry_commands=retry_commands)
    nemesis = Nemesis(deployment, clock, seed)
    load.start()
    try:
        if each_once:
            nemesis.run_each(kinds)
        else:
            nemesis.run(duration, kinds)
        time.sleep(2.0)  # a last stretch of load on the settled cluster
    finally:
        ops = load.stop()
    history = History(ops, nemesis.faults, deployment.urls, commands_retried=retry_commands)
    history.write(deployment.root / "history.jsonl")
    assert deployment.kafka is not None
    events = read_events(deployment.kafka.bootstrap, deployment.partitions)
    return Outcome(history, check(history, events), len(events), time.monotonic() - began)


def read_events(bootstrap: str, partitions: int, timeout: float = 60.0) -> list[Event]:
    """Every committed event of the events topic, read up to the ends the partitions' leaders
    report (their last stable offsets): reading only to the first end-of-partition could stop
    short at a newly elected leader, whose high watermark trails until its followers fetch."""
    consumer = Consumer(consumer_config(bootstrap))  # read_committed: librdkafka's default
    try:
        ends = {
            tp.partition: tp.offset
            for tp in consumer.offsets_for_times(
                [TopicPartition(EVENTS_TOPIC, p, OFFSET_END) for p in range(partitions)],
                timeout=timeout,
            )
        }
        consumer.assign([TopicPartition(EVENTS_TOPIC, p, 0) for p in range(partitions)])
        events: list[Event] = []
        reached = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while any(reached[p] < ends[p] for p in reached):
            assert time.monotonic() < deadline, f"read {reached} of {ends} in {timeout}s"
            message: Any
            for message in consumer.consume(1000, 0.5):
                m = message
                if m.error() is None:
                    events.append(
                        parse_event(
                            m.partition(), m.offset(), m.key(), m.value(), list(m.headers() or ())
                        )
                    )
                    reached[m.partition()] = max(reached[m.partition()], m.offset() + 1)
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    reached[m.partition()] = max(reached[m.partition()], m.offset())
        return events
    finally:
        consumer.close()


def summary(outcome: Outcome, console: Console) -> None:
    """The run's table: each guarantee, how often it was checked, its violations."""
    table = Table(title="guarantees")
    for column in ("guarantee", "checked", "violations", "first violation"):
        table.add_column(column)
    verdict = outcome.verdict
    for guarantee in sorted(set(verdict.checked) | set(verdict.violations)):
        found = verdict.violations.get(guarantee, [])
        table.add_row(
            guarantee,
            str(verdict.checked.get(guarantee, 0)),
            str(len(found)),
            found[0] if found else "",
        )
    console.print(table)
    ops = Counter((op.kind, op.status) for op in outcome.history.ops)
    console.print(
        "operations: "
        + ", ".join(
            f"{kind} {status or 'no answer'}: {n}"
            for (kind, status), n in sorted(ops.items(), key=str)
        )
    )
    faults = Counter(f.action for f in outcome.history.faults)
    console.print("faults: " + ", ".join(f"{a}: {n}" for a, n in sorted(faults.items())))
    console.print(f"events in the log: {outcome.events}; {outcome.seconds:.0f} s")
