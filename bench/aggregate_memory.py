"""Peak memory of an instance holding many aggregates (``python -m bench --only aggregates``).

``held_aggregates`` products' first events are written in bulk to the inventory's events topic;
one inventory instance starts on them (its command side replays every partition, writing the
aggregate store; its projections fold the same events) and answers commands for
:data:`SAMPLE` products picked at random (most not in its cache: read from the store), each
answer's version checked. The figure is the peak PSS of the instance's whole process tree (the
API process, Spark's JVM and Python workers) from its start until those commands are folded.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

from bench.commands import command_answered, key_in, version_of
from bench.inventory import PARTITIONS
from bench.procs import PeakRss, pid_of
from bench.report import Figure
from bench.run import BenchRun
from bench.workload import inventory_events, produce, sku
from foldstream.kafka import TopicSpec, ensure_topics
from foldstream.process import InstanceProcess
from foldstream.settings import Settings

GB = 1e9
EVENTS_TOPIC = "inventory.events"
#: Products that get a command once every partition was taken over.
SAMPLE = 1_000
#: How long the instance may take to replay and fold everything.
LONGEST_S = 7200.0


def _take_over_and_command(instance: InstanceProcess, held: int) -> list[int]:
    """Wait until every partition answers commands, then command :data:`SAMPLE` random
    products once each; their versions after the command."""
    deadline = time.monotonic() + LONGEST_S
    for partition in range(PARTITIONS):
        command_answered(instance.url, key_in(partition, PARTITIONS), deadline)
    # Not the probes' products, which had a command already.
    probed = {key_in(p, PARTITIONS) for p in range(PARTITIONS)}
    rng = random.Random(25)
    sample = [k for k in (sku(n) for n in rng.sample(range(held), SAMPLE + 10)) if k not in probed]
    with ThreadPoolExecutor(16) as pool:
        answers = pool.map(lambda key: command_answered(instance.url, key, deadline), sample)
        return [version_of(a) for a in answers][:SAMPLE]


def aggregate_memory_figures(run: BenchRun, bootstrap: str) -> list[Figure]:
    held = run.size["held_aggregates"]
    ensure_topics(bootstrap, [TopicSpec(EVENTS_TOPIC, PARTITIONS)])
    run.step(
        f"producing {held:,} products' first events",
        lambda: produce(bootstrap, EVENTS_TOPIC, inventory_events(held, held)),
    )
    instance = InstanceProcess(
        bootstrap=bootstrap,
        state_dir=run.tmp / "aggregates",
        partitions=PARTITIONS,
        log_path=run.tmp / "aggregates.log",
    )
    started = time.perf_counter()
    with instance, PeakRss(pid_of(instance)) as peak:
        versions = run.step(
            f"instance taking {held:,} aggregates over, then {SAMPLE:,} commands",
            lambda: _take_over_and_command(instance, held),
        )
        run.step("their events folded", lambda: instance.wait_ready(LONGEST_S))
    took = time.perf_counter() - started
    wrong = sum(v != 2 for v in versions)
    split = ", ".join(f"{k} {v / GB:.2f}" for k, v in sorted(peak.split.items()))
    return [
        Figure(
            f"peak PSS of an instance holding {held:,} aggregates",
            peak.peak_pss / GB,
            "GB",
            target=("<=", 1.5),
            absolute=True,
            note=f"{PARTITIONS} partitions, aggregate cache {Settings().aggregate_cache_size:,}; "
            f"PSS by process: {split}; RSS summed {peak.peak / GB:.2f} GB; start → "
            f"{SAMPLE:,} commands answered and folded in {took:.0f} s; "
            + (f"{wrong} answers NOT at version 2" if wrong else "every answer at version 2"),
            details={"peak PSS by kind": peak.split, "peak RSS": peak.peak, "seconds": took},
        )
    ]
