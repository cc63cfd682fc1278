"""Commands per CPU-second of the API process beside a minimal appending app
(``python -m bench --only commands_vs_plain``).

The inventory instance (warm, on a broker of its own) and :mod:`bench.command_server` (a
Starlette + uvicorn app appending the same event with the same group commit, to a topic of its
own with as many partitions on the same broker) take the same load, ``receive_shipment`` of one
item for random products, at :data:`CONNECTIONS` connections, in alternated rounds. The CPU
counted is the API process's alone (the instance's root process: HTTP, the command side, the
cluster's threads and the store host its Spark tasks write through; not its JVM or Python
workers), sampled as :class:`~bench.procs.CpuMeter` does for the command figure.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

from bench.commands import command_load
from bench.inventory import PARTITIONS, inventory_instance
from bench.load import run_load
from bench.procs import CpuMeter, cpu_seconds
from bench.report import Figure
from bench.run import BenchRun
from bench.servers import ServerProcess
from foldstream.broker import free_port
from foldstream.kafka import TopicSpec, ensure_topics

PLAIN_TOPIC = "plain.events"
CONNECTIONS = 64


class CommandServerProcess(ServerProcess):
    """``python -m bench.command_server`` on ``port``, appending to ``topic``."""

    def __init__(self, *, bootstrap: str, topic: str, partitions: int, port: int) -> None:
        self.kind = "plain commands"
        self.url = f"http://127.0.0.1:{port}"
        self.args = [
            sys.executable, "-m", "bench.command_server", "--bootstrap", bootstrap,
            "--topic", topic, "--partitions", str(partitions), "--port", str(port),
        ]  # fmt: skip
        self.process = None


@dataclass(frozen=True)
class Round:
    """Commands of one round per CPU-second of the API process (and of the whole tree)."""

    per_api_cpu: float
    per_tree_cpu: float
    per_second: float
    p99_ms: float
    failed: int


def _round(run: BenchRun, url: str, pid: int) -> Round:
    load = command_load(run.size["command_keys"])
    with CpuMeter(pid) as cpu:
        result = run_load(run.wrk, url, load, seconds=run.size["seconds"], connections=CONNECTIONS)
    return Round(
        per_api_cpu=result.requests / max(cpu.root_seconds, 1e-9),
        per_tree_cpu=result.requests / max(cpu.seconds, 1e-9),
        per_second=result.requests / result.seconds,
        p99_ms=result.p99_ms,
        failed=result.non_2xx + result.errors,
    )


def plain_command_figures(run: BenchRun) -> list[Figure]:
    ours: list[Round] = []
    plain: list[Round] = []
    with inventory_instance(run, "commands beside a minimal app") as (broker, instance, target):
        ensure_topics(broker.bootstrap, [TopicSpec(PLAIN_TOPIC, PARTITIONS)])
        server = CommandServerProcess(
            bootstrap=broker.bootstrap, topic=PLAIN_TOPIC, partitions=PARTITIONS, port=free_port()
        )
        with server:
            # Unmeasured: the app's first transactions and its products' first versions.
            _round(run, server.url, server.pid)
            instance.wait_ready(timeout=600)
            idle = _idle_cpu(target.pid)
            for n in range(run.size["rounds"]):
                instance.wait_ready(timeout=600)  # the last round's commands are folded
                ours.append(
                    run.step(
                        f"round {n + 1}: instance", lambda: _round(run, instance.url, target.pid)
                    )
                )
                plain.append(
                    run.step(
                        f"round {n + 1}: minimal app", lambda: _round(run, server.url, server.pid)
                    )
                )
    return [_figure(ours, plain, idle)]


def _idle_cpu(pid: int, seconds: float = 3.0) -> float:
    """CPU-seconds per second the process ``pid`` alone uses while no request comes."""
    before, started = cpu_seconds(pid, tree=False), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(pid, tree=False) - before) / (time.perf_counter() - started)


def _figure(ours: list[Round], plain: list[Round], idle: float) -> Figure:
    def median(rounds: list[Round], field: str) -> float:
        return statistics.median(getattr(r, field) for r in rounds)

    note = (
        f"{CONNECTIONS} connections, medians of {len(ours)} alternated rounds; commands/s "
        f"{median(ours, 'per_second'):,.0f} vs {median(plain, 'per_second'):,.0f}, p99 "
        f"{median(ours, 'p99_ms'):.0f} vs {median(plain, 'p99_ms'):.0f} ms; the instance's "
        f"whole tree (with the fold): {median(ours, 'per_tree_cpu'):,.0f} commands/CPU-s; "
        f"its API process uses {idle:.2f} CPU-s/s idle (background threads), "
        f"{idle / (median(ours, 'per_second') / median(ours, 'per_api_cpu')):.0%} of what it "
        "used under load"
    )
    failed = sum(r.failed for r in ours), sum(r.failed for r in plain)
    if any(failed):
        note += f"; non-2xx/errors: {failed[0]} instance, {failed[1]} minimal app"
    return Figure(
        "commands per CPU-s of the API process",
        median(ours, "per_api_cpu"),
        "cmd/CPU-s",
        median(plain, "per_api_cpu"),
        "minimal Starlette app appending the same event, same group commit",
        (">=", 0.67),
        note=note,
        details={
            "instance": [vars(r) for r in ours],
            "minimal app": [vars(r) for r in plain],
            "instance API process idle CPU-s/s": idle,
        },
    )
