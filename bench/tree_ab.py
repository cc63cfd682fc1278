"""``python -m bench.tree_ab --base PATH``: this tree against another worktree (``PATH``, with
its own ``.venv``), the same workloads in one run, rounds alternated, for a change's cost:

- freshness: an inventory instance of each tree, each on a Kafka node of its own (both running
  throughout), the freshness client (:mod:`bench.freshness`) at ``--rate`` commands/s against
  one at a time; per round the probes' freshness p50 / p99 and the instance tree's CPU per
  command;
- rebuild: each tree's own :func:`bench.rebuild.spark_rebuild` (a ``local[2]`` session in a
  process of that tree's Python) folding the same pre-produced events into empty stores, on
  one more Kafka node: events/s from query start.

Not part of ``make bench``: it measures a change, not the product against its references.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import freshness
from bench.procs import CpuMeter, pid_of
from bench.workload import inventory_events, produce
from foldstream.broker import KafkaCluster
from foldstream.kafka import TopicSpec, ensure_topics
from foldstream.process import InstanceProcess
from foldstream.scrape import activity, scrape
from foldstream.settings import Settings

HERE = Path(__file__).resolve().parent.parent
PARTITIONS = 4
#: Run under each tree's Python, in its directory: its own rebuild of the topic, as JSON.
REBUILD = """
import json, sys
from pathlib import Path
from bench.rebuild import spark_rebuild
from foldstream.settings import Settings
from foldstream.spark import spark_session
bootstrap, state_dir, partitions = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
settings = Settings(service="rebuild", bootstrap_servers=bootstrap, state_dir=state_dir,
                    partitions=partitions)
spark = spark_session("local[2]", "tree-ab")
try:
    rate, figures = spark_rebuild(spark, settings, partitions)
finally:
    spark.stop()
print("RESULT " + json.dumps({"events/s": rate, **figures}))
"""


class TreeInstance(InstanceProcess):
    """An instance run by another tree's Python (its ``.venv``)."""

    def __init__(self, tree: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tree = tree
        self.python = str(tree / ".venv" / "bin" / "python")

    def _spawn(self, log: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        # In the tree's directory: ``python -m`` puts the working directory first on its path.
        saved, sys.executable = sys.executable, self.python
        cwd = os.getcwd()
        os.chdir(self.tree)
        try:
            return super()._spawn(log, env)
        finally:
            sys.executable = saved
            os.chdir(cwd)


def freshness_round(instance: InstanceProcess, rate: float, seconds: float) -> dict[str, float]:
    """The round's freshness, the instance's CPU per command, and its micro-batches' and
    tasks' mean times (``stock``'s, from its metrics: where a change of the fold's path
    shows with less noise than end to end)."""
    instance.wait_ready(timeout=600)
    before = scrape(instance.url)
    with CpuMeter(pid_of(instance)) as tree:
        result = freshness.run_client(instance.url, rate=rate, seconds=seconds, keys=1000)
    during = activity(before, scrape(instance.url), "stock")
    ms = sorted((p.visible - p.acknowledged) * 1000 for p in result.probes if p.visible is not None)
    return {
        "p50 ms": freshness.percentile(ms, 0.5),
        "p99 ms": freshness.percentile(ms, 0.99),
        "probes": len(ms),
        "sent": result.sent,
        "instance CPU ms/command": tree.seconds * 1000 / max(result.sent, 1),
        "batch mean ms": during.batch_mean_ms,
        **{f"task {step} ms": value for step, value in during.task_mean_ms.items()},
    }


def rebuild_round(tree: Path, bootstrap: str, state_dir: Path) -> dict[str, float]:
    done = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), "-c", REBUILD, bootstrap, str(state_dir),
         str(PARTITIONS)],
        cwd=tree, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"rebuild under {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tree_ab", description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="the other worktree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0, help="commands/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="per freshness round")
    parser.add_argument("--events", type=int, default=300_000, help="rebuilt per round")
    parser.add_argument("--keys", type=int, default=30_000)
    parser.add_argument("--json", type=Path, help="where to write every round's figures")
    parser.add_argument("--no-rebuild", action="store_true", help="freshness rounds only")
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE}
    tmp = Path(tempfile.mkdtemp(prefix="tree-ab-"))
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        name: {"freshness": [], "rebuild": []} for name in trees
    }
    with ExitStack() as stack:
        instances = {}
        for name, tree in trees.items():
            broker = stack.enter_context(KafkaCluster(data_dir=tmp / f"kafka-{name}"))
            instances[name] = stack.enter_context(
                TreeInstance(
                    tree,
                    bootstrap=broker.bootstrap,
                    state_dir=tmp / f"state-{name}",
                    partitions=PARTITIONS,
                )  # fmt: skip
            )
        for instance in instances.values():
            instance.wait_ready(timeout=900)
        for n in range(args.rounds):
            for name in trees if n % 2 == 0 else reversed(trees):
                figures = freshness_round(instances[name], args.rate, args.seconds)
                results[name]["freshness"].append(figures)
                print(f"round {n + 1} {name} freshness: {figures}", flush=True)
        for instance in instances.values():
            instance.stop()
        if not args.no_rebuild:
            rebuild_rounds(stack, trees, tmp, args, results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    summary(results)


def rebuild_rounds(
    stack: ExitStack,
    trees: dict[str, Path],
    tmp: Path,
    args: argparse.Namespace,
    results: dict[str, dict[str, list[dict[str, float]]]],
) -> None:
    """Each tree's rebuild of the same events, alternated, on a Kafka node of their own."""
    rebuild = stack.enter_context(KafkaCluster(data_dir=tmp / "kafka-rebuild"))
    settings = Settings(service="rebuild", bootstrap_servers=rebuild.bootstrap)
    ensure_topics(
        rebuild.bootstrap,
        [
            TopicSpec(settings.events_topic, PARTITIONS),
            TopicSpec(settings.changelog_topic("stock"), PARTITIONS, compact=True),
        ],
    )
    produce(rebuild.bootstrap, settings.events_topic, inventory_events(args.keys, args.events))
    for n in range(args.rounds):
        for name in trees if n % 2 == 0 else reversed(trees):
            state = tmp / f"rebuild-{name}-{n}-{time.monotonic_ns()}"
            figures = rebuild_round(trees[name], rebuild.bootstrap, state)
            results[name]["rebuild"].append(figures)
            print(f"round {n + 1} {name} rebuild: {figures['events/s']:,.0f} ev/s", flush=True)


def summary(results: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    """Medians over the rounds of each tree, and this tree's over the base's."""
    figures = {
        "freshness p50 ms": ("freshness", "p50 ms"),
        "freshness p99 ms": ("freshness", "p99 ms"),
        "instance CPU ms/command": ("freshness", "instance CPU ms/command"),
        "micro-batch mean ms": ("freshness", "batch mean ms"),
        "task commit mean ms": ("freshness", "task commit ms"),
        "rebuild events/s": ("rebuild", "events/s"),
    }
    for label, (kind, key) in figures.items():
        if not all(results[n][kind] for n in results):
            continue  # not measured in this run
        medians = {n: statistics.median(r.get(key, 0.0) for r in results[n][kind]) for n in results}
        print(
            f"{label}: this {medians['this']:,.1f}, base {medians['base']:,.1f}, "
            f"ratio {medians['this'] / medians['base']:.3f}"
        )


if __name__ == "__main__":
    main()
