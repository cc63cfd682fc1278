"""Freshness and command throughput, each round on an inventory instance and a broker of its
own."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import commands, freshness, lookups
from bench.procs import CpuMeter, PeakRss, pid_of
from bench.report import Figure
from bench.run import BenchRun
from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess
from foldstream.scrape import Activity, activity, scrape

PARTITIONS = 4
#: A rate at which the instance, the broker and the load client leave most of a core idle
#: (1.26-1.32 of 2 used in full runs): freshness there is the pipeline's own latency; at the
#: issue's 1k/s they use 1.63-1.66.
LOW_RATE = 100.0


@contextmanager
def inventory_instance(
    run: BenchRun, purpose: str
) -> Iterator[tuple[KafkaCluster, InstanceProcess, lookups.Target]]:
    """A warm inventory instance on a broker of its own, for one ``purpose``.

    Each round gets a fresh broker, so no round pays for the records an earlier one wrote
    (every round writes tens of thousands).
    """
    with KafkaCluster() as broker:
        instance = InstanceProcess(
            bootstrap=broker.bootstrap,
            state_dir=Path(tempfile.mkdtemp(prefix="inventory-", dir=run.tmp)),
            partitions=PARTITIONS,
        )
        with instance, PeakRss(pid_of(instance)) as peak:
            run.step(
                f"starting an inventory instance ({purpose})",
                lambda: instance.wait_ready(timeout=600),
            )
            target = lookups.Target("inventory instance", instance.url, pid_of(instance))
            # A just-started JVM is still compiling: freshness is measured on a warm instance,
            # as the do-nothing reference batch is (it runs after the rebuild, in a warm JVM).
            run.step(
                "warming the instance up with commands",
                lambda: lookups.warm_up(
                    run.wrk,
                    target,
                    commands.command_load(run.size["command_keys"]),
                    run.size["seconds"],
                ),
            )
            yield broker, instance, target
        run.memory[f"inventory instance ({purpose})"] = peak


def _freshness_round(
    run: BenchRun,
    broker: KafkaCluster,
    instance: InstanceProcess,
    rate: float,
    label: str = "",
) -> tuple[freshness.ClientResult, Activity]:
    """The freshness client at ``rate``, the cores used meanwhile, and what the instance's
    projection did."""
    assert broker.pid is not None, "the broker is not running"
    instance.wait_ready(timeout=600)  # no backlog left from the warm-up
    before = scrape(instance.url)
    started = time.perf_counter()
    with CpuMeter(pid_of(instance)) as tree, CpuMeter(broker.pid) as on_broker:
        client: freshness.ClientResult = run.step(
            f"{label}freshness at {rate:,.0f} commands/s for {run.size['fresh_seconds']:g}s",
            lambda: freshness.run_client(
                instance.url,
                rate=rate,
                seconds=run.size["fresh_seconds"],
                keys=run.size["command_keys"],
            ),
        )
    # Over the whole run, the load client's start included (it counts its own CPU).
    wall = time.perf_counter() - started
    client.cores = {
        "instance": tree.seconds / wall,
        "broker": on_broker.seconds / wall,
        "load client": client.cpu_s / wall,
    }
    return client, activity(before, scrape(instance.url), "stock")


def inventory_figures(run: BenchRun, noop: dict[str, float]) -> list[Figure]:
    """Freshness and command throughput on inventory instances."""
    figures: list[Figure] = []
    for rate in (run.size["rate"], LOW_RATE):
        with inventory_instance(run, f"freshness at {rate:,.0f} commands/s") as (
            broker,
            instance,
            _,
        ):
            client, during = _freshness_round(run, broker, instance, rate)
        # The reference on an instance and broker of its own too, from the same history, not
        # beside the projection: the broker's CPU for a tailing consumer (see
        # inventory_instance) would be taken from the projection's round on 2 cores.
        with inventory_instance(run, f"reference at {rate:,.0f} commands/s") as (
            broker,
            instance,
            _,
        ):
            tail = freshness.TailingFold(
                broker.bootstrap, "inventory.events", PARTITIONS, run.tmp / f"tail-{rate:.0f}"
            )
            with tail:
                tailed, _ = _freshness_round(run, broker, instance, rate, "reference: ")
        figures += _freshness_figures(
            client, tail, tailed, noop, during, rate=rate, targeted=rate == run.size["rate"]
        )
    with inventory_instance(run, "commands") as (
        broker,
        instance,
        target,
    ):
        figures += run.step(
            "command throughput vs lookups, same instance",
            lambda: commands.command_figures(
                run.wrk,
                instance,
                target,
                keys=run.size["command_keys"],
                seconds=run.size["seconds"],
                broker_pid=broker.pid,
            ),
        )
    return figures


def _freshness_figures(
    client: freshness.ClientResult,
    tail: freshness.TailingFold,
    tailed: freshness.ClientResult,
    noop: dict[str, float],
    during: Activity,
    *,
    rate: float,
    targeted: bool,
) -> list[Figure]:
    """Freshness p50 and p99 of one client run (the issue's targets apply at the 1k/s rate),
    and the tailing consumer's for the commands of the ``tailed`` run. The p99's note compares
    the projection's micro-batches during the run (from the instance's ``/metrics``) with the
    do-nothing ones, phase by phase."""
    seen = [p for p in client.probes if p.visible is not None]
    served = [(p.visible - p.acknowledged) * 1e3 for p in seen if p.visible is not None]
    tailing = [
        max(0.0, (t - p.acknowledged) * 1e3)
        for p in tailed.probes
        if (t := tail.visible_at(p.partition, p.offset)) is not None
    ]
    batch = noop["median"]
    achieved = client.sent / client.seconds if client.seconds else 0.0
    cores = ", ".join(f"{name} {used:.2f}" for name, used in client.cores.items())
    common = (
        f"{len(served)}/{len(client.probes)} probes seen; {achieved:,.0f} commands/s sent "
        f"({client.failed} failed), ack p50 {freshness.percentile(client.ack_ms, 0.5):.1f} ms; "
        f"load client {client.cpu_s / max(1, client.sent) * 1e6:.0f} µs CPU/command; cores "
        f"used: {cores} (sum {sum(client.cores.values()):.2f} of {len(os.sched_getaffinity(0))})"
    )
    reference = f"do-nothing Python reader→writer batch (median, p90 {noop['p90']:.0f} ms)"
    noop_phases = ", ".join(
        f"{name.removeprefix('phase ')} {ms:.0f}"
        for name, ms in sorted(noop.items())
        if name.startswith("phase ") and ms >= 1
    )
    # The tasks' own work (fetching, folding, changelog, commit) against the rest of the
    # batch: what is left is Spark's own time, which the load on the machine (API, broker,
    # load client) stretches beyond the idle reference. Per batch, its tasks' times summed:
    # right for the steady state's one-task batches.
    own = sum(during.task_mean_ms.values()) * during.tasks / max(1, during.batches)
    spark_alone = during.batch_mean_ms - own
    batches = (
        f"{during.describe()}; do-nothing batch phases (mean ms): {noop_phases}, and its "
        f"writer's wait for the reader's rows (median) {noop['writer wait']:.1f} ms, which a "
        f"projection task does not have (it folds where it reads); the tasks' own steps take "
        f"{own:.0f} ms per batch, the rest {spark_alone:.0f} ms "
        f"= {spark_alone / batch:.2f}× the do-nothing batch"
    )
    details = {
        "noop": noop,
        "served_ms": served,
        "tailing_ms": tailing,
        "cores": client.cores,
        "projection": vars(during),
    }
    at = f"at {rate:,.0f} commands/s"
    targets = {0.5: 2.0, 0.99: 4.0}
    # The reference has a Python writer, which the projection does without: also the
    # ratio to the do-nothing query of the projection's own shape (reader → JVM noop sink).
    own_shape = noop["noop sink median"]
    shapes = ", ".join(
        f"p{q * 100:.0f} {freshness.percentile(served, q) / own_shape:.2f}×" for q in (0.5, 0.99)
    )
    common += (
        f"; against a do-nothing reader → JVM noop sink batch ({own_shape:.0f} ms, the "
        f"projection's own shape): {shapes}"
    )
    notes = {
        0.5: common if targeted else f"{common}; info",
        0.99: batches,
    }
    figures = [
        Figure(
            f"freshness p{q * 100:.0f} {at}"
            + (": command ack → visible through the query API" if q == 0.5 else ""),
            freshness.percentile(served, q),
            "ms",
            batch,
            reference,
            ("<=", targets[q]) if targeted else None,
            note=notes[q],
            details=details if q == 0.5 else {},
        )
        for q in (0.5, 0.99)
    ]
    if tailing:
        figures.append(
            Figure(
                f"reference {at}: plain tailing consumer, same fold (p50; p99 in note)",
                freshness.percentile(tailing, 0.5),
                "ms",
                note=f"p99 {freshness.percentile(tailing, 0.99):.0f} ms; measured in a round of "
                f"its own (fresh broker and instance, same warm-up and rate); info",
            )
        )
    return figures
