"""Commands per CPU-second of the API process beside a minimal appending app
(``python -m bench --only commands_vs_plain``).

The inventory instance (warm, on a broker of its own) and :mod:`bench.command_server` (a
Starlette + uvicorn app appending the same event with the same group commit, to a topic of its
own with as many partitions on the same broker) take the same load, ``receive_shipment`` of one
item for random products, in alternated rounds. The CPU counted is the API process's alone (the
instance's root process: HTTP, the command side, the cluster's threads and the store host its
Spark tasks write through; not its JVM or Python workers), sampled as :class:`~bench.procs.CpuMeter`
does for the command figure.

The figure compares both **at the same rate**: commands sent open-loop at the size's
``command_rate`` (:func:`bench.freshness.run_client`), below what the instance sustains. A
server's CPU per command depends on its rate: at a higher one each wake-up of its event loop
and each transaction serve more commands. At the same connections the minimal app runs several
times the instance's rate (the instance shares the cores with its fold), so that comparison,
printed beside as information, measures the rates as much as the work.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from dataclasses import dataclass

from bench.commands import command_load
from bench.freshness import client_process, percentile, run_client
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
#: A side answering less than this share of the commands sent on schedule did not keep the rate
#: (said in the note).
KEPT_RATE = 0.95


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
    kept: bool = True  # it answered the rate it was sent (open-loop rounds)

    @classmethod
    def of(
        cls, answered: int, cpu: CpuMeter, seconds: float, p99_ms: float, failed: int, kept: bool
    ) -> Round:
        """The round of ``answered`` commands in ``seconds``, ``cpu`` counted meanwhile."""
        return cls(
            per_api_cpu=answered / max(cpu.root_seconds, 1e-9),
            per_tree_cpu=answered / max(cpu.seconds, 1e-9),
            per_second=answered / max(seconds, 1e-9),
            p99_ms=p99_ms,
            failed=failed,
            kept=kept,
        )


def _closed_round(run: BenchRun, url: str, pid: int) -> Round:
    """``wrk`` at :data:`CONNECTIONS` connections, each sending its next command on an answer."""
    load = command_load(run.size["command_keys"])
    with CpuMeter(pid) as cpu:
        result = run_load(run.wrk, url, load, seconds=run.size["seconds"], connections=CONNECTIONS)
    answered = max(0, result.requests - result.non_2xx)  # wrk's requests are its answers
    failed = result.non_2xx + result.errors
    return Round.of(answered, cpu, result.seconds, result.p99_ms, failed, kept=True)


def _open_round(run: BenchRun, url: str, pid: int) -> Round:
    """Commands sent on schedule at the size's ``command_rate``, whatever the answers' pace;
    the CPU counted while they are sent (the client process is started before)."""
    with client_process() as process, CpuMeter(pid) as cpu:
        result = run_client(
            url,
            rate=run.size["command_rate"],
            seconds=run.size["seconds"],
            keys=run.size["command_keys"],
            probe_every=0,
            process=process,
        )
    answered = result.sent - result.failed
    # Counted, not a rate: the round's time runs on until its last answer came.
    sent_on_schedule = run.size["command_rate"] * run.size["seconds"]
    p99_ms = percentile(result.ack_ms, 0.99) if result.ack_ms else float("nan")
    kept = answered >= KEPT_RATE * sent_on_schedule
    return Round.of(answered, cpu, result.seconds, p99_ms, result.failed, kept)


def plain_command_figures(run: BenchRun) -> list[Figure]:
    ours, plain = "instance", "minimal app"
    closed: dict[str, list[Round]] = {ours: [], plain: []}
    equal: dict[str, list[Round]] = {ours: [], plain: []}
    rate = run.size["command_rate"]
    with inventory_instance(run, "commands beside a minimal app") as (broker, instance, target):
        ensure_topics(broker.bootstrap, [TopicSpec(PLAIN_TOPIC, PARTITIONS)])
        server = CommandServerProcess(
            bootstrap=broker.bootstrap, topic=PLAIN_TOPIC, partitions=PARTITIONS, port=free_port()
        )
        with server:
            # Unmeasured: the app's first transactions and its products' first versions.
            _closed_round(run, server.url, server.pid)
            instance.wait_ready(timeout=600)
            idle = _idle_cpu(target.pid)
            sides = {ours: (instance.url, target.pid), plain: (server.url, server.pid)}
            for n in range(run.size["rounds"]):
                for side, (url, pid) in sides.items():
                    instance.wait_ready(timeout=600)  # the last round's commands are folded
                    closed[side].append(
                        run.step(
                            f"round {n + 1}, {CONNECTIONS} connections: {side}",
                            functools.partial(_closed_round, run, url, pid),
                        )
                    )
            for n in range(run.size["rounds"]):
                for side, (url, pid) in sides.items():
                    instance.wait_ready(timeout=600)
                    equal[side].append(
                        run.step(
                            f"round {n + 1}, {rate:,.0f} commands/s: {side}",
                            functools.partial(_open_round, run, url, pid),
                        )
                    )
    return [
        _equal_rate_figure(equal[ours], equal[plain], rate, idle),
        _same_connections_figure(closed[ours], closed[plain]),
    ]


def _median(rounds: list[Round], field: str) -> float:
    return statistics.median(getattr(r, field) for r in rounds)


def _idle_cpu(pid: int, seconds: float = 3.0) -> float:
    """CPU-seconds per second the process ``pid`` alone uses while no request comes."""
    before, started = cpu_seconds(pid, tree=False), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(pid, tree=False) - before) / (time.perf_counter() - started)


def _failed_note(ours: list[Round], plain: list[Round]) -> str:
    failed = sum(r.failed for r in ours), sum(r.failed for r in plain)
    return f"; non-2xx/errors: {failed[0]} instance, {failed[1]} minimal app" if any(failed) else ""


def _equal_rate_figure(ours: list[Round], plain: list[Round], rate: float, idle: float) -> Figure:
    answered_per_s = _median(ours, "per_second"), _median(plain, "per_second")
    note = (
        f"{rate:,.0f} commands/s sent open-loop to each, medians of {len(ours)} alternated "
        f"rounds; answered/s {answered_per_s[0]:,.0f} vs {answered_per_s[1]:,.0f}, p99 "
        f"{_median(ours, 'p99_ms'):.0f} vs {_median(plain, 'p99_ms'):.0f} ms; the instance's "
        f"whole tree (with the fold): {_median(ours, 'per_tree_cpu'):,.0f} commands/CPU-s; its "
        f"API process uses {idle:.2f} CPU-s/s idle (background threads)"
    )
    if _median(ours, "per_api_cpu") > 0:
        used = answered_per_s[0] / _median(ours, "per_api_cpu")
        note += f", {idle / max(used, 1e-9):.0%} of what it used at this rate"
    behind = [
        side
        for side, rounds in (("instance", ours), ("minimal app", plain))
        if not all(r.kept for r in rounds)
    ]
    if behind:
        note += f"; NOT KEPT the rate sent: {', '.join(behind)}"
    note += _failed_note(ours, plain)
    return Figure(
        f"commands per CPU-s of the API process, both at {rate:,.0f} commands/s",
        _median(ours, "per_api_cpu"),
        "cmd/CPU-s",
        _median(plain, "per_api_cpu"),
        "minimal Starlette app appending the same event, same group commit, same rate",
        (">=", 0.67),
        note=note,
        details={
            "rate": rate,
            "instance": [vars(r) for r in ours],
            "minimal app": [vars(r) for r in plain],
            "instance API process idle CPU-s/s": idle,
        },
    )


def _same_connections_figure(ours: list[Round], plain: list[Round]) -> Figure:
    note = (
        f"info: {CONNECTIONS} connections each, medians of {len(ours)} alternated rounds; the "
        f"rates differ: commands/s {_median(ours, 'per_second'):,.0f} vs "
        f"{_median(plain, 'per_second'):,.0f}, p99 {_median(ours, 'p99_ms'):.0f} vs "
        f"{_median(plain, 'p99_ms'):.0f} ms; the instance's whole tree (with the fold): "
        f"{_median(ours, 'per_tree_cpu'):,.0f} commands/CPU-s"
    ) + _failed_note(ours, plain)
    return Figure(
        f"commands per CPU-s of the API process, {CONNECTIONS} connections each",
        _median(ours, "per_api_cpu"),
        "cmd/CPU-s",
        _median(plain, "per_api_cpu"),
        "minimal Starlette app at the same connections (a higher rate)",
        note=note,
        details={"instance": [vars(r) for r in ours], "minimal app": [vars(r) for r in plain]},
    )
