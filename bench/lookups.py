"""Lookups per server CPU-second (GET by key) and batch lookup keys per CPU-second, for a running
instance beside a minimal Starlette + uvicorn app reading the same stores, in alternating rounds.

The instance's CPU is its whole process tree (API, JVM, Spark's Python workers), as a deployed
instance pays it; the API process alone is in the details. Variants serve foldstream's own query
routes without an instance, on uvicorn and on granian.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.load import Load, run_load
from bench.procs import CpuMeter, cpu_seconds
from bench.report import Figure
from bench.servers import ServerProcess
from foldstream.broker import free_port

BATCH = 100


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    pid: int


@dataclass(frozen=True)
class LookupSetup:
    """The stores the lookups read (``keys`` keys formatted with ``key_format``) and how long
    they are measured (``rounds`` alternated rounds of ``seconds``)."""

    state_dir: Path
    store: str
    partitions: int
    partitioner: str
    keys: int
    key_format: str
    seconds: float
    rounds: int

    def get(self) -> Load:
        return Load("GET", f"/stores/{self.store}/keys/{{key}}", self.keys, self.key_format)


@dataclass
class Rate:
    """Requests (or keys) per CPU-second of a target's tree and of its root process."""

    per_cpu: float
    per_root_cpu: float
    per_second: float
    p99_ms: float
    non_2xx: int


def measure(
    wrk: str | None, target: Target, load: Load, seconds: float, connections: int = 32
) -> Rate:
    with CpuMeter(target.pid) as cpu:
        result = run_load(wrk, target.url, load, seconds=seconds, connections=connections)
    done = result.requests * max(1, load.batch)
    return Rate(
        per_cpu=done / cpu.seconds,
        per_root_cpu=done / max(cpu.root_seconds, 1e-9),
        per_second=done / result.seconds,
        p99_ms=result.p99_ms,
        non_2xx=result.non_2xx + result.errors,
    )


def warm_up(
    wrk: str | None, target: Target, load: Load, seconds: float = 3.0, idle_cpu: float = 0.3
) -> None:
    """An unmeasured round, then a wait (up to 60 s) until the target's tree uses less than
    ``idle_cpu`` of a core: a just-started instance is still compiling (JVM), starting Python
    workers and running its first micro-batches, which would be charged to the lookups."""
    run_load(wrk, target.url, load, seconds=seconds, connections=32)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        before = cpu_seconds(target.pid)
        time.sleep(1.0)
        if cpu_seconds(target.pid) - before < idle_cpu:
            return


def mean_rate(rates: list[Rate]) -> Rate:
    n = len(rates)
    return Rate(
        per_cpu=sum(r.per_cpu for r in rates) / n,
        per_root_cpu=sum(r.per_root_cpu for r in rates) / n,
        per_second=sum(r.per_second for r in rates) / n,
        p99_ms=max(r.p99_ms for r in rates),
        non_2xx=sum(r.non_2xx for r in rates),
    )


def _servers(
    stack: ExitStack,
    setup: LookupSetup,
    kinds: tuple[str, ...] = ("minimal", "foldstream-uvicorn", "foldstream-granian"),
) -> Iterator[Target]:
    for kind in kinds:
        server = stack.enter_context(
            ServerProcess(
                kind,
                state_dir=setup.state_dir,
                store=setup.store,
                partitions=setup.partitions,
                partitioner=setup.partitioner,
                port=free_port(),
            )
        )
        yield Target(kind, server.url, server.pid)


def lookup_figures(wrk: str | None, instance: Target, setup: LookupSetup) -> list[Figure]:
    get = setup.get()
    batch = Load("POST", f"/stores/{setup.store}/keys", setup.keys, setup.key_format, batch=BATCH)
    warm_up(wrk, instance, get)
    with ExitStack() as stack:
        targets = [instance, *_servers(stack, setup)]
        singles: dict[str, list[Rate]] = {t.name: [] for t in targets}
        batches: dict[str, list[Rate]] = {t.name: [] for t in targets[:2]}
        for _ in range(setup.rounds):  # alternate, so drifting machine load hits every target alike
            for target in targets:
                singles[target.name].append(measure(wrk, target, get, setup.seconds))
            for target in targets[:2]:
                batches[target.name].append(measure(wrk, target, batch, setup.seconds))
    single = {name: mean_rate(rates) for name, rates in singles.items()}
    many = {name: mean_rate(rates) for name, rates in batches.items()}
    reference = single["minimal"]
    details = {name: vars(rate) for name, rate in single.items()}
    figures = [
        Figure(
            f"lookups per server CPU-s, GET by key, {setup.keys:,} keys",
            single[instance.name].per_cpu,
            "req/CPU-s",
            reference.per_cpu,
            "minimal Starlette+uvicorn rocksdict get",
            (">=", 1.0),
            note=(
                f"instance tree (API+JVM+workers); API process alone "
                f"{single[instance.name].per_root_cpu:,.0f}/CPU-s; p99 "
                f"{single[instance.name].p99_ms:.1f} ms vs {reference.p99_ms:.1f} ms; "
                "stretch ≥ 1.25×"
            ),
            details=details,
        )
    ]
    for variant, label in (
        ("foldstream-uvicorn", "variant: foldstream query routes on uvicorn, no Spark beside"),
        ("foldstream-granian", "variant: foldstream query routes on granian (stretch path)"),
    ):
        figures.append(
            Figure(
                label,
                single[variant].per_cpu,
                "req/CPU-s",
                reference.per_cpu,
                "minimal Starlette+uvicorn rocksdict get",
                (">=", 1.25) if "granian" in variant else None,
                note=f"p99 {single[variant].p99_ms:.1f} ms",
            )
        )
    figures.append(
        Figure(
            f"batch lookup keys per server CPU-s ({BATCH} keys/request)",
            many[instance.name].per_cpu,
            "keys/CPU-s",
            many["minimal"].per_cpu,
            "minimal app, same batches",
            (">=", 250_000),
            absolute=True,
            note=(
                f"API process alone {many[instance.name].per_root_cpu:,.0f} keys/CPU-s; "
                f"{many[instance.name].per_second:,.0f} keys/s wall"
            ),
            details={name: vars(rate) for name, rate in many.items()},
        )
    )
    bad = sum(r.non_2xx for r in single.values()) + sum(r.non_2xx for r in many.values())
    if bad:
        figures[0].note += f"; {bad} non-2xx/errors!"
    return figures


def instance_on_granian_figure(wrk: str | None, instance: Target, setup: LookupSetup) -> Figure:
    """Lookups per CPU-second of an instance run with ``--server granian``, beside the minimal
    app in alternating rounds (its own rounds: the machine's load drifts between figures)."""
    get = setup.get()
    warm_up(wrk, instance, get)
    with ExitStack() as stack:
        (minimal,) = _servers(stack, setup, ("minimal",))
        measured: dict[str, list[Rate]] = {instance.name: [], minimal.name: []}
        for _ in range(setup.rounds):
            for target in (instance, minimal):
                measured[target.name].append(measure(wrk, target, get, setup.seconds))
    on_granian, reference = mean_rate(measured[instance.name]), mean_rate(measured[minimal.name])
    return Figure(
        f"lookups per server CPU-s, instance with --server granian, {setup.keys:,} keys",
        on_granian.per_cpu,
        "req/CPU-s",
        reference.per_cpu,
        "minimal Starlette+uvicorn rocksdict get",
        (">=", 1.0),
        note=(
            f"instance tree (API+JVM+workers); p99 {on_granian.p99_ms:.1f} ms vs "
            f"{reference.p99_ms:.1f} ms; stretch ≥ 1.25×"
            + (f"; {on_granian.non_2xx} non-2xx/errors!" if on_granian.non_2xx else "")
        ),
        details={"instance": vars(on_granian), "minimal": vars(reference)},
    )
