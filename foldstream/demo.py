"""``make demo``: any service end to end on the embedded defaults (the inventory example unless
told otherwise).

Starts a broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` is set) and one instance, sends random
commands over HTTP, then compares what the query API serves with a plain-Python fold of the
events the commands appended (:func:`foldstream.projections.reference.fold_topic`).
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
from rich.table import Table

from foldstream.broker import EmbeddedBroker
from foldstream.cluster_tour import tour
from foldstream.domain import commands_of
from foldstream.errors import ConfigurationError
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.projections.reference import fold_topic
from foldstream.service import Service, load_service
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


def _random_value(kind: Any, rng: random.Random) -> Any:
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
    menu = command_menu(definition)
    settings = Settings(service=definition.name, partitions=partitions)
    sent_ids: set[str] = set()
    accepted = rejected = 0
    with (
        _bootstrap(console) as bootstrap,
        tempfile.TemporaryDirectory(prefix="foldstream-demo-") as tmp,
    ):
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
        instance = instances[0]
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
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("sending commands", total=commands)
                for _ in range(commands):
                    aggregate, command, kinds = rng.choice(menu)
                    aggregate_id = f"{aggregate}-{rng.randrange(IDS_PER_AGGREGATE):03d}"
                    arguments = {p: _random_value(k, rng) for p, k in kinds.items()}
                    # Any instance will do: one that does not own the aggregate redirects (307).
                    target = instances[len(sent_ids) % instances_count]
                    status, body = http(
                        "POST",
                        f"{target.url}/commands/{aggregate}/{aggregate_id}/{command}",
                        arguments,
                    )
                    sent_ids.add(aggregate_id)
                    if status == 200:
                        accepted += 1
                    elif status == 422:
                        rejected += 1
                    else:
                        console.print(
                            f"[red]unexpected {status} for {command} {aggregate_id}: {body}"
                        )
                        return 1
                    progress.advance(task)
            sent_at = time.monotonic()
            stores = {
                p.store: fold_topic(bootstrap, p, settings.events_topic, partitions)
                for p in definition.projections
                if p.source_topic(settings.events_topic) == settings.events_topic
            }
            folded_after = time.monotonic() - sent_at
            queried = _wait_for(instance.url, stores, sorted(sent_ids), timeout=60)
            visible_after = time.monotonic() - sent_at
            table = Table(
                title=f"stores after {accepted} accepted and {rejected} rejected commands"
            )
            for column in ("store", "key", "folded from the events", "queried", ""):
                table.add_column(column)
            mismatches = 0
            for store, expected in stores.items():
                for key in sorted(sent_ids):
                    want, got = expected.get(key), queried[store].get(key)
                    ok = want == got
                    mismatches += not ok
                    table.add_row(
                        store, key, str(want), str(got), "[green]ok" if ok else "[red]MISMATCH"
                    )
            console.print(table)
            console.print(
                f"queried values matched the fold {visible_after:.2f}s after the last command was "
                f"acknowledged (reading the events back for the fold took {folded_after:.2f}s)"
            )
            if mismatches:
                console.print(
                    f"[red]{mismatches} mismatches; instance log tail:\n{instance.log_tail()}"
                )
                return 1
            if instances_count > 1 and stores:
                store = next(iter(stores))
                values = {k: v for k, v in stores[store].items() if v is not None}
                if not tour(console, instances, store, values):
                    console.print("[red]the cluster tour failed; see the table above")
                    return 1
            console.print("[green]demo passed")
            return 0


def _wait_for(
    url: str, stores: dict[str, dict[str, Any]], keys: list[str], timeout: float
) -> dict[str, dict[str, Any]]:
    """Query every key until all match (or ``timeout``); returns the last values seen."""
    deadline = time.monotonic() + timeout
    while True:
        queried = {store: {k: _lookup(url, store, k) for k in keys} for store in stores}
        if all(queried[s].get(k) == stores[s].get(k) for s in stores for k in keys):
            return queried
        if time.monotonic() > deadline:
            return queried
        time.sleep(0.05)


def _lookup(url: str, store: str, key: str) -> Any:
    status, body = http("GET", f"{url}/stores/{store}/keys/{key}")
    return body["value"] if status == 200 else None
