"""``make demo``: any service end to end on the embedded defaults (the inventory example unless
told otherwise).

Starts a broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` is set) and the instances, sends random
commands over HTTP (and, for a service that declares them, writes its demo records to the
topics it reads: :class:`~foldstream.service.DemoRecords`), then compares what the query API
serves, for every store, with a plain-Python fold of the topics
(:func:`foldstream.projections.reference.fold_topic`, :mod:`foldstream.demo_stores`); re-keyed,
chained and joined stores with a plain-Python computation of the service's whole graph
(:func:`foldstream.projections.reference_graph.fold_service`).
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from foldstream import demo_stores
from foldstream.broker import KafkaCluster
from foldstream.cluster_tour import tour
from foldstream.domain import commands_of
from foldstream.errors import ConfigurationError
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.projections.graph import is_hidden
from foldstream.projections.joins import Join
from foldstream.projections.reference_graph import fold_service
from foldstream.service import Service, load_service
from foldstream.settings import Settings

DEFAULT_SERVICE = "foldstream.examples.inventory:service"
IDS_PER_AGGREGATE = 12
#: The words text arguments are filled with (and the keys of demo records that match them).
WORDS = ("red", "green", "blue", "north", "south", "small", "large")


@contextlib.contextmanager
def _bootstrap(console: Console) -> Iterator[str]:
    existing = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if existing:
        console.print(f"using Kafka at {existing}")
        yield existing
        return
    with KafkaCluster(progress=console.print) as broker:
        console.print(f"Apache Kafka at {broker.bootstrap}")
        yield broker.bootstrap


def _random_value(kind: Any, rng: random.Random) -> Any:
    if kind is bool:
        return rng.random() < 0.5
    if kind is int:
        return rng.randint(1, 20)
    if kind is float:
        return round(rng.uniform(1, 20), 2)
    if kind is str:
        return rng.choice(WORDS)
    raise TypeError(kind)


def command_menu(service: Service) -> list[tuple[str, str, dict[str, Any]]]:
    """``(aggregate, command, {argument: type})`` of every command the demo can fill in.

    Raises :class:`ConfigurationError` when no command takes only int, float, str or bool.
    """
    menu = []
    for name, aggregate in service.aggregates.items():
        for command, signature in commands_of(aggregate).items():
            hints = typing.get_type_hints(getattr(aggregate, command))
            kinds = {p: hints.get(p) for p in signature.parameters}
            if all(k in (bool, int, float, str) for k in kinds.values()):
                menu.append((name, command, kinds))
    if not menu:
        raise ConfigurationError(
            f"service {service.name!r} has no command whose arguments are all int, float, str or "
            "bool, so the demo cannot invent commands for it; send commands with curl instead"
        )
    return menu


def random_command(
    menu: list[tuple[str, str, dict[str, Any]]], rng: random.Random
) -> tuple[str, str, str, dict[str, Any]]:
    """``(aggregate, aggregate id, command, arguments)`` picked at random from ``menu``."""
    aggregate, command, kinds = rng.choice(menu)
    aggregate_id = f"{aggregate}-{rng.randrange(IDS_PER_AGGREGATE):03d}"
    return aggregate, aggregate_id, command, {p: _random_value(k, rng) for p, k in kinds.items()}


def run_demo(
    *,
    service: str = DEFAULT_SERVICE,
    commands: int = 300,
    partitions: int = 6,
    instances_count: int = 3,
    seed: int = 7,
) -> int:
    """Run the demo; returns the exit code (0 when every queried value is as expected)."""
    console = Console()
    rng = random.Random(seed)
    definition = load_service(service)
    menu = command_menu(definition) if definition.aggregates or definition.demo is None else []
    settings = Settings(service=definition.name, partitions=partitions)
    with (
        _bootstrap(console) as bootstrap,
        tempfile.TemporaryDirectory(prefix="foldstream-demo-") as tmp,
    ):
        keys: set[str] = set()
        if definition.demo is not None:  # its topics must exist before an instance starts
            keys |= demo_stores.write_demo_records(bootstrap, definition, rng)
            console.print(f"wrote {definition.name}'s demo records: {len(keys)} keys")
        stack = contextlib.ExitStack()
        instances = [
            stack.enter_context(
                InstanceProcess(
                    bootstrap=bootstrap,
                    state_dir=Path(tmp) / f"state-{n}",
                    service=service,
                    partitions=partitions,
                    log_path=Path(tmp) / f"instance-{n}.log",
                )
            )
            for n in range(instances_count)
        ]
        with stack:
            with console.status(
                f"starting {instances_count} instance(s) of {definition.name} "
                "(Spark, projections, API)…"
            ):
                started = time.monotonic()
                for each in instances:
                    each.wait_ready()
                if instances_count > 1:
                    wait_cluster_stable(instances)
            console.print(
                f"{instances_count} instance(s) ready at {', '.join(i.url for i in instances)} "
                f"in {time.monotonic() - started:.1f}s"
            )
            summary = "the demo records"
            if menu:
                sent = _send_commands(console, instances, menu, commands, rng)
                if sent is None:
                    return 1
                summary = f"{sent[1]} accepted and {sent[2]} rejected commands"
                keys |= sent[0]
            return _check_stores(console, bootstrap, definition, settings, instances, keys, summary)


def _send_commands(
    console: Console,
    instances: list[InstanceProcess],
    menu: list[tuple[str, str, dict[str, Any]]],
    commands: int,
    rng: random.Random,
) -> tuple[set[str], int, int] | None:
    """Random commands through the instances in turn: ``(ids, accepted, rejected)``, or None
    after an unexpected answer."""
    sent_ids: set[str] = set()
    accepted = rejected = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("sending commands", total=commands)
        for _ in range(commands):
            aggregate, aggregate_id, command, arguments = random_command(menu, rng)
            # Any instance will do: one that does not own the aggregate redirects (307).
            target = instances[len(sent_ids) % len(instances)]
            status, body = http(
                "POST", f"{target.url}/commands/{aggregate}/{aggregate_id}/{command}", arguments
            )
            sent_ids.add(aggregate_id)
            if status == 200:
                accepted += 1
            elif status == 422:
                rejected += 1
            else:
                console.print(f"[red]unexpected {status} for {command} {aggregate_id}: {body}")
                return None
            progress.advance(task)
    return sent_ids, accepted, rejected


def _check_stores(
    console: Console,
    bootstrap: str,
    definition: Service,
    settings: Settings,
    instances: list[InstanceProcess],
    keys: set[str],
    summary: str,
) -> int:
    """Every store read back and compared with a plain fold of its topic, an ordered store's
    range between two times, then (with several instances) the cluster tour."""
    instance = instances[0]
    sent_at = time.monotonic()
    events = settings.events_topic
    layout = {events: settings.partitions} | dict(definition.demo.topics if definition.demo else {})
    shown = [p for p in definition.projections if not is_hidden(p)]
    projections = [p for p in shown if p.source_topic(events) in layout]
    expected = demo_stores.expected_stores(bootstrap, projections, events, layout)
    if any(isinstance(p, Join) for p in shown):  # their keys are not the commands' ids
        graph = fold_service(bootstrap, definition.projections, events)
        projections += [p for p in shown if isinstance(p, Join)]
        expected |= {s: v for s, v in graph.items() if isinstance(definition.projection(s), Join)}
        keys |= {key for values in graph.values() for key in values}
    folded_after = time.monotonic() - sent_at
    ordered_keys = sorted(keys)
    queried = demo_stores.wait_served(instance.url, projections, expected, ordered_keys, 60)
    visible_after = time.monotonic() - sent_at
    mismatches = demo_stores.compare(
        console, projections, expected, queried, ordered_keys, f"stores after {summary}"
    )
    console.print(
        f"queried values matched the fold {visible_after:.2f}s after the last write was "
        f"acknowledged (reading the topics back for the fold took {folded_after:.2f}s)"
    )
    for projection in projections:
        if projection.kind == "ordered" and not demo_stores.show_range(
            console, instance.url, projection, expected[projection.store]
        ):
            mismatches += 1
    if mismatches:
        console.print(f"[red]{mismatches} mismatches; instance log tail:\n{instance.log_tail()}")
        return 1
    point = next((p.store for p in projections if p.kind == "point"), None)
    if len(instances) > 1 and point is not None:
        values = {k: v for k, v in expected[point].items() if v is not None}
        if not tour(console, instances, point, values):
            console.print("[red]the cluster tour failed; see the table above")
            return 1
    console.print("[green]demo passed")
    return 0
