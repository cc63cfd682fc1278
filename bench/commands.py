"""Command throughput per server CPU-second (and p99) beside lookups per CPU-second of the same
instance. The instance's CPU is its whole tree: a command's cost includes folding its events.

Group commit puts the commands that queue up during a partition's transaction into its next one,
so the cost of a command falls as concurrency rises, until the machine saturates. The load runs
at several connection counts; the figure is the best round, and every round is in the note with
its CPU split by process (the API process, Spark's JVM and Python workers, and the broker, which
is not part of the instance but shares the machine's cores)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from bench.load import Load, run_load
from bench.lookups import Target, measure
from bench.procs import CpuMeter
from bench.report import Figure
from foldstream.errors import FoldstreamError
from foldstream.kafka import partition_for
from foldstream.process import InstanceProcess, http

#: What every command of the benches does: one item received by a product.
COMMAND_PATH = "/commands/product/{key}/receive_shipment"
#: Connections of the command rounds (16 to 128 commands in flight over 4 partitions).
CONNECTIONS = (16, 64, 128)
#: The Spark side of an instance: what folds the events a command appended.
SPARK_KINDS = ("jvm", "spark python workers")


@dataclass(frozen=True)
class CommandRound:
    """One load round: commands/s, commands per CPU-second of the instance's tree, p99, and
    CPU µs per command by kind of process (``"root"`` is the API process; ``"broker"`` the
    broker's, outside the tree)."""

    connections: int
    per_second: float
    per_cpu: float
    p99_ms: float
    non_2xx: int
    us_per_command: dict[str, float]

    def spark_us(self) -> float:
        return sum(self.us_per_command.get(kind, 0.0) for kind in SPARK_KINDS)

    def describe(self) -> str:
        split = ", ".join(f"{kind} {us:,.0f}" for kind, us in sorted(self.us_per_command.items()))
        return (
            f"{self.connections} conn: {self.per_cpu:,.0f}/CPU-s, {self.per_second:,.0f}/s, "
            f"p99 {self.p99_ms:.0f} ms (µs/cmd: {split})"
        )


def command_load(keys: int) -> Load:
    return Load("POST", COMMAND_PATH, keys, body='{"quantity":1}')


def command_answered(url: str, key: str, deadline: float, pause_s: float = 0.01) -> Any:
    """Send :data:`COMMAND_PATH` for ``key`` to ``url`` (redirects followed) again and again
    until it answers 200 or ``deadline`` (monotonic) passed; its answer. A member taking the
    partition over answers 503 or redirects to the owner that is gone meanwhile."""
    last: Any = None
    while time.monotonic() < deadline:
        try:
            status, last = http("POST", url + COMMAND_PATH.format(key=key), {"quantity": 1}, 5)
        except (OSError, FoldstreamError) as exc:
            last = repr(exc)
        else:
            if status == 200:
                return last
        time.sleep(pause_s)
    raise FoldstreamError(f"{url}: no command for {key!r} answered in time; last: {last}")


def version_of(answer: Any) -> int:
    """The version a command's answer says its aggregate reached (its last event's)."""
    return int(answer["events"][-1]["version"])


def key_in(partition: int, partitions: int, name: str = "sku-%07d") -> str:
    """The first key ``name % n`` whose events land in ``partition``."""
    return next(
        name % n
        for n in range(1_000_000)
        if partition_for((name % n).encode(), partitions) == partition
    )


def command_round(
    wrk: str | None,
    instance: InstanceProcess,
    pid: int,
    broker_pid: int | None,
    *,
    keys: int,
    seconds: float,
    connections: int,
) -> CommandRound:
    """Commands at ``connections`` for ``seconds``, after the previous load was folded. The CPU
    counted runs until this round's commands are folded too."""
    instance.wait_ready(timeout=600)
    with ExitStack() as stack:
        tree = stack.enter_context(CpuMeter(pid))
        broker = stack.enter_context(CpuMeter(broker_pid)) if broker_pid else None
        result = run_load(
            wrk, instance.url, command_load(keys), seconds=seconds, connections=connections
        )
        instance.wait_ready(timeout=600)
    done = max(1, result.requests)
    split = {kind: cpu / done * 1e6 for kind, cpu in tree.by_kind.items() if cpu > 0}
    if broker is not None:
        split["broker"] = broker.seconds / done * 1e6
    return CommandRound(
        connections=connections,
        per_second=result.requests / result.seconds,
        per_cpu=result.requests / max(tree.seconds, 1e-9),
        p99_ms=result.p99_ms,
        non_2xx=result.non_2xx + result.errors,
        us_per_command=split,
    )


def command_figures(
    wrk: str | None,
    instance: InstanceProcess,
    target: Target,
    *,
    keys: int,
    seconds: float,
    broker_pid: int | None = None,
) -> list[Figure]:
    rounds = [
        command_round(
            wrk,
            instance,
            target.pid,
            broker_pid,
            keys=keys,
            seconds=seconds,
            connections=connections,
        )
        for connections in CONNECTIONS
    ]
    best = max(rounds, key=lambda r: r.per_cpu)
    # Every key gets a command, so that every lookup finds its key (a 404 takes the slower path).
    load = command_load(keys)
    body = json.loads(load.body or "{}")
    with ThreadPoolExecutor(16) as pool:
        sent = pool.map(
            lambda n: http(
                load.method, instance.url + load.path.format(key=load.key_format % n), body
            )[0],
            range(keys),
        )
        assert set(sent) == {200}, "priming the keys for lookups failed"
    instance.wait_ready(timeout=600)  # the projection caught up: every key is there to look up
    lookups = measure(wrk, target, Load("GET", "/stores/stock/keys/{key}", keys), seconds)
    # Spark's share alone bounds the figure, whatever the API process costs.
    spark_bound = 1e6 / best.spark_us() if best.spark_us() else None
    note = f"best of {len(rounds)} rounds; " + "; ".join(r.describe() for r in rounds)
    if spark_bound:
        note += (
            f". The fold's Spark processes alone ({best.spark_us():,.0f} µs/cmd at "
            f"{best.connections} conn) allow at most {spark_bound:,.0f} cmd/CPU-s = "
            f"{spark_bound / lookups.per_cpu:.2f}× lookups"
        )
    failed = sum(r.non_2xx for r in rounds)
    if failed or lookups.non_2xx:
        note += f"; non-2xx/errors: {failed} commands, {lookups.non_2xx} lookups"
    return [
        Figure(
            "command throughput per server CPU-s",
            best.per_cpu,
            "cmd/CPU-s",
            lookups.per_cpu,
            f"lookups/CPU-s of the same instance ({keys:,} keys)",
            note=f"info (the target is on the API process beside a minimal app: "
            f"commands_vs_plain); {note}",
            details={"rounds": [vars(r) for r in rounds], "lookups": vars(lookups)},
        ),
        Figure(
            f"command p99 latency (best round, {best.connections} connections)",
            best.p99_ms,
            "ms",
            note=f"info: no target; {best.per_second:,.0f} commands/s",
        ),
    ]
