"""Command throughput per server CPU-second (and p99) beside lookups per CPU-second of the same
instance. The instance's CPU is its whole tree: a command's cost includes folding its events."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from bench.load import Load
from bench.lookups import Target, measure
from bench.report import Figure
from foldstream.process import InstanceProcess, http


def command_figures(
    wrk: str | None, instance: InstanceProcess, target: Target, *, keys: int, seconds: float
) -> list[Figure]:
    commands = measure(
        wrk,
        target,
        Load("POST", "/commands/product/{key}/receive_shipment", keys, body='{"quantity":1}'),
        seconds,
        connections=16,
    )
    # Every key gets a command, so that every lookup finds its key (a 404 takes the slower path).
    with ThreadPoolExecutor(16) as pool:
        sent = pool.map(
            lambda n: http(
                "POST",
                f"{instance.url}/commands/product/{Load.key_format % n}/receive_shipment",
                {"quantity": 1},
            )[0],
            range(keys),
        )
        assert set(sent) == {200}, "priming the keys for lookups failed"
    instance.wait_ready(timeout=600)  # the projection caught up: every key is there to look up
    lookups = measure(wrk, target, Load("GET", "/stores/stock/keys/{key}", keys), seconds)
    note = (
        f"{commands.per_second:,.0f} commands/s at 16 connections, p99 {commands.p99_ms:.1f} ms; "
        f"API process alone {commands.per_root_cpu:,.0f}/CPU-s"
    )
    if commands.non_2xx or lookups.non_2xx:
        note += f"; non-2xx/errors: {commands.non_2xx} commands, {lookups.non_2xx} lookups"
    return [
        Figure(
            "command throughput per server CPU-s",
            commands.per_cpu,
            "cmd/CPU-s",
            lookups.per_cpu,
            f"lookups/CPU-s of the same instance ({keys:,} keys)",
            (">=", 0.5),
            note=note,
            details={"commands": vars(commands), "lookups": vars(lookups)},
        ),
        Figure("command p99 latency (same run)", commands.p99_ms, "ms", note="info: no target"),
    ]
