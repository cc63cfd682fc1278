"""``make demo``: the inventory service end to end on the embedded defaults.

Starts a broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` is set) and one instance, sends commands
over HTTP, then compares the stock the query API serves with what the commands should have left.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from foldstream.broker import EmbeddedBroker
from foldstream.process import InstanceProcess, http

SKUS = [f"sku-{n:03d}" for n in range(12)]


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


def run_demo(*, commands: int = 300, partitions: int = 6, seed: int = 7) -> int:
    """Run the demo; returns the exit code (0 when every queried value is as expected)."""
    console = Console()
    rng = random.Random(seed)
    expected = dict.fromkeys(SKUS, 0)
    exists = dict.fromkeys(SKUS, False)
    accepted = rejected = 0
    with (
        _bootstrap(console) as bootstrap,
        tempfile.TemporaryDirectory(prefix="foldstream-demo-") as tmp,
    ):
        instance = InstanceProcess(
            bootstrap=bootstrap,
            state_dir=Path(tmp) / "state",
            partitions=partitions,
            log_path=Path(tmp) / "instance.log",
        )
        with instance:
            with console.status("starting instance (Spark, projections, API)…"):
                started = time.monotonic()
                instance.wait_ready()
            console.print(f"instance ready at {instance.url} in {time.monotonic() - started:.1f}s")
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("sending commands", total=commands)
                for _ in range(commands):
                    sku = rng.choice(SKUS)
                    if rng.random() < 0.55:
                        command, quantity = "receive_shipment", rng.randint(1, 20)
                    else:
                        command, quantity = "sell", rng.randint(1, 15)
                    status, body = http(
                        "POST",
                        f"{instance.url}/commands/product/{sku}/{command}",
                        {"quantity": quantity},
                    )
                    if status == 200:
                        accepted += 1
                        expected[sku] += quantity if command == "receive_shipment" else -quantity
                        exists[sku] = True
                    elif status == 422:
                        rejected += 1
                    else:
                        console.print(f"[red]unexpected {status} for {command} {sku}: {body}")
                        return 1
                    progress.advance(task)
            sent_at = time.monotonic()
            queried = _wait_for(instance.url, expected, exists, timeout=60)
            visible_after = time.monotonic() - sent_at
        table = Table(title=f"stock after {accepted} accepted and {rejected} rejected commands")
        for column in ("sku", "expected on_hand", "queried on_hand", ""):
            table.add_column(column)
        mismatches = 0
        for sku in SKUS:
            got = queried.get(sku)
            ok = got == (expected[sku] if exists[sku] else None)
            mismatches += not ok
            table.add_row(sku, str(expected[sku]), str(got), "[green]ok" if ok else "[red]MISMATCH")
        console.print(table)
        console.print(
            f"all values visible {visible_after:.2f}s after the last command was acknowledged"
        )
        if mismatches:
            console.print(
                f"[red]{mismatches} mismatches; instance log tail:\n{instance.log_tail()}"
            )
            return 1
        console.print("[green]demo passed")
        return 0


def _wait_for(
    url: str, expected: dict[str, int], exists: dict[str, bool], timeout: float
) -> dict[str, int | None]:
    """Query every SKU until all match (or ``timeout``); returns the last values seen."""
    deadline = time.monotonic() + timeout
    while True:
        queried = {sku: _stock(url, sku) for sku in expected}
        if all(queried[s] == (expected[s] if exists[s] else None) for s in expected):
            return queried
        if time.monotonic() > deadline:
            return queried
        time.sleep(0.05)


def _stock(url: str, sku: str) -> int | None:
    status, body = http("GET", f"{url}/stores/stock/keys/{sku}")
    return int(body["value"]["on_hand"]) if status == 200 else None
