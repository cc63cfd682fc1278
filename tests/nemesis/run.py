"""One nemesis run: a deployment, clients recording every operation, the nemesis injecting
faults for a while, then the events topic read and the history checked."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from foldstream.testing.kafka import read_topic
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
    write_events(deployment.root / "events.jsonl", events)
    return Outcome(history, check(history, events), len(events), time.monotonic() - began)


def read_events(bootstrap: str, partitions: int, topic: str = EVENTS_TOPIC) -> list[Event]:
    """Every committed event of the events topic, once every transaction open when the load
    stopped has ended (:func:`~foldstream.testing.kafka.read_topic`).

    A command is answered once the coordinator decided its commit; the markers land after, and
    until then a committed read ends before the transaction: read at once, the log the checker
    holds answers against could lack the last commands. The read goes to the ends the
    partitions' leaders answer by ListOffsets, asked again while a newly elected one answers
    none: a failed answer must not end a partition's read early."""
    return [parse_event(*record) for record in read_topic(bootstrap, topic, partitions)]


def write_events(path: Path, events: list[Event]) -> None:
    """The log a history is checked against, an event a line: a failed check can be looked
    into after the run, the cluster gone."""
    with path.open("w") as out:
        for event in events:
            out.write(json.dumps(asdict(event)) + "\n")


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
