"""``make demo``: any service end to end on the embedded defaults (the inventory example unless
told otherwise).

Starts a broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` is set) and one instance, sends random
commands over HTTP (and, for a service that declares :class:`~foldstream.service.DemoRecords`,
records to the topics other producers write, such as price ticks), then compares every key of
every store the query API serves, re-keyed, chained and joined stores included, with a
plain-Python computation of the whole graph from the topics
(:func:`foldstream.projections.reference_graph.fold_service`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from foldstream.broker import EmbeddedBroker
from foldstream.cluster_tour import tour
from foldstream.domain import commands_of
from foldstream.errors import ConfigurationError
from foldstream.kafka import TopicSpec, ensure_topics, partition_for, producer_config
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.projections.reference_graph import fold_service
from foldstream.service import DemoRecords, Service, load_service
from foldstream.settings import Settings

DEFAULT_SERVICE = "foldstream.examples.inventory:service"
IDS_PER_AGGREGATE = 12
_WORDS = ("red", "green", "blue", "north", "south", "small", "large")


@contextlib.contextmanager
def _bootstrap(console: Console) -> Iterator[str]:
    existing = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if existing:
        console.print(f"using Kafka at {existing}")
        yield existing
        return
    with EmbeddedBroker() as broker:
        console.print(f"embedded broker at {broker.bootstrap}")
        yield broker.bootstrap


def random_value(kind: Any, rng: random.Random) -> Any:
    if kind is bool:
        return rng.random() < 0.5
    if kind is int:
        return rng.randint(1, 20)
    if kind is float:
        return round(rng.uniform(1, 20), 2)
    if kind is str:
        return rng.choice(_WORDS)
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


def demo_topics(service: Service, partitions: int) -> list[TopicSpec]:
    """The topics the demo writes for other producers (they must exist before an instance
    starts: its stores read them)."""
    return [TopicSpec(r.topic, partitions) for r in service.demo_records]


def random_command(
    menu: list[tuple[str, str, dict[str, Any]]], rng: random.Random
) -> tuple[str, str, str, dict[str, Any]]:
    """``(aggregate, aggregate id, command, arguments)`` picked at random from ``menu``."""
    aggregate, command, kinds = rng.choice(menu)
    aggregate_id = f"{aggregate}-{rng.randrange(IDS_PER_AGGREGATE):03d}"
    return aggregate, aggregate_id, command, {p: random_value(k, rng) for p, k in kinds.items()}


def random_records(service: Service, rng: random.Random) -> list[tuple[DemoRecords, bytes, bytes]]:
    """The records to write, after one command, to the topics other producers write:
    ``(their declaration, key, JSON value)``, keys among the words text arguments get."""
    return [
        (records, rng.choice(_WORDS).encode(), json.dumps(records.value(rng)).encode())
        for records in service.demo_records
        if rng.random() < records.per_command
    ]


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
    definition = load_service(service)
    menu = command_menu(definition)
    settings = Settings(service=definition.name, partitions=partitions)
    with (
        _bootstrap(console) as bootstrap,
        tempfile.TemporaryDirectory(prefix="foldstream-demo-") as tmp,
    ):
        if definition.demo_records:
            ensure_topics(bootstrap, demo_topics(definition, partitions))
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
            traffic = _Traffic(definition, menu, bootstrap, partitions, random.Random(seed))
            if not traffic.send(console, instances, commands):
                return 1
            return _compare(console, definition, settings, bootstrap, instances, traffic)


class _Traffic:
    """The demo's commands (and records of other producers), sent at random."""

    def __init__(
        self,
        service: Service,
        menu: list[tuple[str, str, dict[str, Any]]],
        bootstrap: str,
        partitions: int,
        rng: random.Random,
    ) -> None:
        self.service, self.menu, self.rng = service, menu, rng
        self.partitions = partitions
        self.producer = Producer(producer_config(bootstrap)) if service.demo_records else None
        self.accepted = self.rejected = self.records = 0

    def send(self, console: Console, instances: list[InstanceProcess], commands: int) -> bool:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("sending commands", total=commands)
            for number in range(commands):
                aggregate, aggregate_id, command, arguments = random_command(self.menu, self.rng)
                # Any instance will do: one that does not own the aggregate redirects (307).
                target = instances[number % len(instances)]
                status, body = http(
                    "POST", f"{target.url}/commands/{aggregate}/{aggregate_id}/{command}", arguments
                )
                if status == 200:
                    self.accepted += 1
                elif status == 422:
                    self.rejected += 1
                else:
                    console.print(f"[red]unexpected {status} for {command} {aggregate_id}: {body}")
                    return False
                self._write_records()
                progress.advance(task)
        if self.producer is not None:
            self.producer.flush(30)
        return True

    def _write_records(self) -> None:
        for records, key, value in random_records(self.service, self.rng):
            assert self.producer is not None
            partition = partition_for(key, self.partitions, records.partitioner)
            self.producer.produce(records.topic, key=key, value=value, partition=partition)
            self.records += 1
        if self.producer is not None:
            self.producer.poll(0)


def _compare(
    console: Console,
    definition: Service,
    settings: Settings,
    bootstrap: str,
    instances: list[InstanceProcess],
    traffic: _Traffic,
) -> int:
    """Print every store's every key, computed and queried; 0 when all match."""
    sent_at = time.monotonic()
    stores = fold_service(bootstrap, definition.projections, settings.events_topic)
    folded_after = time.monotonic() - sent_at
    instance = instances[0]
    queried = _wait_for(instance.url, stores, timeout=60)
    visible_after = time.monotonic() - sent_at
    table = Table(
        title=f"stores after {traffic.accepted} accepted and {traffic.rejected} rejected "
        f"commands and {traffic.records} records of other producers"
    )
    for column in ("store", "key", "computed from the topics", "queried", ""):
        table.add_column(column)
    mismatches = 0
    for store, expected in stores.items():
        for key in sorted(expected):
            want, got = expected[key], queried[store].get(key)
            mismatches += want != got
            mark = "[green]ok" if want == got else "[red]MISMATCH"
            table.add_row(store, key, str(want), str(got), mark)
    console.print(table)
    console.print(
        f"queried values matched the computation {visible_after:.2f}s after the last command "
        f"was acknowledged (reading the topics back for it took {folded_after:.2f}s)"
    )
    if mismatches:
        console.print(f"[red]{mismatches} mismatches; instance log tail:\n{instance.log_tail()}")
        return 1
    if len(instances) > 1 and stores:
        store = next(iter(stores))
        values = {k: v for k, v in stores[store].items() if v is not None}
        if not tour(console, instances, store, values):
            console.print("[red]the cluster tour failed; see the table above")
            return 1
    console.print("[green]demo passed")
    return 0


def _wait_for(
    url: str, stores: dict[str, dict[str, Any]], timeout: float
) -> dict[str, dict[str, Any]]:
    """Query every key of every store until all match (or ``timeout``); returns the last
    values seen."""
    deadline = time.monotonic() + timeout
    while True:
        queried = {s: {k: _lookup(url, s, k) for k in keys} for s, keys in stores.items()}
        if queried == stores or time.monotonic() > deadline:
            return queried
        time.sleep(0.05)


def _lookup(url: str, store: str, key: str) -> Any:
    status, body = http("GET", f"{url}/stores/{store}/keys/{key}")
    return body["value"] if status == 200 else None
