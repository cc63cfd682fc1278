"""``make bench`` / ``python -m bench [--quick] [--only SECTION ...] [--json PATH]``: every
figure of issue 5 (and the ordered stores' of issue 23) beside its reference, measured in one
run on an embedded broker, printed as a table and written as JSON
(``bench/results/<timestamp>.json`` unless ``--json`` says where). ``--only`` runs some sections
alone, e.g. ``--quick --only ordered``; ``rebuild`` runs the projection rebuild on ``local[2]``
and on a 2-worker standalone Spark cluster, beside the plain consumer; ``rekey`` the two-stage
stores' (issue 22: a chained store's freshness beside a single-stage one's, re-key throughput
beside a plain confluent-kafka pipeline); ``takeover``, ``aggregates``, ``ryw`` and
``commands_vs_plain`` issue 25's (the command side's takeover, memory with many aggregates,
read-your-writes, commands beside a minimal appending app); ``failover_clients`` what clients
see through a ``kill -9`` (redirects into the dead member, reads with ``max_lag`` answered
again); ``sources`` Spark's own Kafka source beside foldstream's Python Data Source (rebuild and
freshness, alternated)."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer
from rich.console import Console

from bench import (
    aggregate_memory,
    broker,
    cluster,
    failover_clients,
    lookups,
    ordered,
    plain_commands,
    read_your_writes,
    rebuild,
    rekey,
    sources,
    spark_standalone,
    takeover,
)
from bench.inventory import PARTITIONS, inventory_figures
from bench.load import wrk_binary
from bench.noop_stream import noop_batch_ms
from bench.procs import PeakRss, pid_of
from bench.report import Figure, print_table, write_json
from bench.run import BenchRun
from bench.sizes import sizes
from bench.workload import inventory_events, produce
from foldstream.broker import KafkaCluster
from foldstream.kafka import TopicSpec, ensure_topics, produce_when_room
from foldstream.process import InstanceProcess
from foldstream.settings import Settings
from foldstream.spark import FAST_CHECKPOINTS, JVM_OPTIONS, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GB = 1e9
ROOT = Path(__file__).resolve().parent.parent
#: The sections of a run, in order. ``inventory`` compares freshness with the do-nothing
#: micro-batches ``rebuild`` measures: it runs ``rebuild`` too.
SECTIONS = (
    "broker",
    "rebuild",
    "lookups",
    "inventory",
    "cluster",
    "ordered",
    "rekey",
    "takeover",
    "aggregates",
    "ryw",
    "commands_vs_plain",
    "failover_clients",
    "sources",
)
#: The sections that run on a broker of their own, each ``(run, bootstrap) -> figures``.
OWN_BROKER: dict[str, Callable[[BenchRun, str], list[Figure]]] = {
    "ordered": ordered.ordered_figures,
    "rekey": rekey.rekey_figures,
    "aggregates": aggregate_memory.aggregate_memory_figures,
    "ryw": read_your_writes.read_your_writes_figures,
    "sources": sources.sources_figures,
}
#: The sections that start the brokers they need themselves, each ``(run) -> figures``.
OWN_BROKERS: dict[str, Callable[[BenchRun], list[Figure]]] = {
    "broker": broker.broker_figures,
    "takeover": takeover.takeover_figures,
    "commands_vs_plain": plain_commands.plain_command_figures,
    "failover_clients": failover_clients.failover_client_figures,
}


def rebuild_figures(
    run: BenchRun, bootstrap: str, *, noop_batches: bool = True
) -> tuple[list[Figure], dict[str, float]]:
    """The rebuild on ``local[2]`` (first) and on a standalone cluster; with ``noop_batches``
    the do-nothing micro-batches (the freshness figures' reference) on ``local[2]`` too."""
    settings = Settings(
        service="rebuild",
        bootstrap_servers=bootstrap,
        state_dir=run.tmp / "rebuild",
        partitions=PARTITIONS,
    )
    ensure_topics(
        bootstrap,
        [
            TopicSpec(settings.events_topic, PARTITIONS),
            TopicSpec(settings.changelog_topic(rebuild.STORE), PARTITIONS, compact=True),
        ],
    )
    events, keys = run.size["events"], run.size["keys"]
    run.step(
        f"producing {events:,} events over {keys:,} products",
        lambda: produce(bootstrap, settings.events_topic, inventory_events(keys, events)),
    )
    reference = run.step(
        "reference: plain consumer fold",
        lambda: rebuild.reference_fold(
            bootstrap, settings.events_topic, PARTITIONS, run.tmp / "reference"
        ),
    )
    started = time.perf_counter()
    spark = run.step("starting Spark (local[2])", lambda: spark_session("local[2]", "bench"))
    jvm_start = time.perf_counter() - started
    try:
        rate, spark_figures = run.step(
            "projection rebuild through Spark",
            lambda: rebuild.spark_rebuild(spark, settings, PARTITIONS),
        )
        for state in (run.tmp / "reference", settings.state_dir):
            rebuild.check_stock(state, PARTITIONS, keys, events)
        noop = _noop_figures(run, spark) if noop_batches else {}
    finally:
        spark.stop()
    figure = Figure(
        f"projection rebuild events/s ({events:,} events, {keys:,} keys, {PARTITIONS} partitions)",
        rate,
        "ev/s",
        reference["events/s"],
        "plain confluent-kafka consumer, same fold, 1 process",
        (">=", 1.0),
        note=(
            f"from query start (JVM up; its start took {jvm_start:.1f}s); CPU: "
            f"{spark_figures['events/CPU-s']:,.0f} ev/CPU-s vs reference "
            f"{reference['events/CPU-s']:,.0f}; values checked against the events"
        ),
        details={**spark_figures, "reference": reference, "jvm start s": jvm_start},
    )
    on_cluster = spark_standalone.cluster_rebuild_figure(run, settings, PARTITIONS, figure)
    return [figure, on_cluster], noop


def _noop_figures(run: BenchRun, spark: SparkSession) -> dict[str, float]:
    noop: dict[str, float] = run.step(
        "do-nothing Python reader → writer micro-batches",
        lambda: noop_batch_ms(spark, run.size["noop_batches"]),
    )
    noop_sink = run.step(
        "do-nothing Python reader → JVM noop sink micro-batches",
        lambda: noop_batch_ms(spark, run.size["noop_batches"], sink="noop"),
    )
    return noop | {"noop sink median": noop_sink["median"], "noop sink p90": noop_sink["p90"]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=SECTIONS,
        metavar="SECTION",
        help=f"run these sections only: {', '.join(SECTIONS)}",
    )
    args = parser.parse_args()
    size = sizes(args.quick)
    sections = set(args.only) | ({"rebuild"} if "inventory" in args.only else set())
    console = Console()
    # Spark's Python workers import bench.noop_stream: they need the checkout on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    wrk = wrk_binary(console) if sections - {"rebuild"} else None
    figures: list[Figure] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="foldstream-bench-") as name:
        run = BenchRun(console, wrk, Path(name), size)
        rebuilt: list[Figure] = []
        noop: dict[str, float] = {}
        if sections & {"rebuild", "lookups"}:
            with KafkaCluster() as broker:
                if "rebuild" in sections:
                    rebuilt, noop = rebuild_figures(
                        run, broker.bootstrap, noop_batches="inventory" in sections
                    )
                    figures += rebuilt
                if "lookups" in sections:
                    figures += _lookups(run, broker.bootstrap)
        if "inventory" in sections:
            figures += inventory_figures(run, noop)
        if "cluster" in sections:
            # Three instances on a broker that holds only their topics.
            with KafkaCluster() as broker:
                figures += run.step(
                    "3-instance cluster: redirects, failover, restore",
                    lambda: cluster.cluster_figures(
                        broker.bootstrap,
                        run.tmp,
                        keys=size["cluster_keys"],
                        lookups=size["cluster_lookups"],
                        rebuild_rate=rebuilt[0].value if rebuilt else None,
                    ),
                )
        for section, figures_of in OWN_BROKER.items():
            if section in sections:
                with KafkaCluster() as broker:
                    figures += figures_of(run, broker.bootstrap)
        figures += [f for s, of in OWN_BROKERS.items() if s in sections for f in of(run)]
    if run.memory:
        figures += _memory_figures(run.memory)
    about = _about(started, size, sections, wrk)
    print_table(
        console,
        f"foldstream bench{' --quick' if args.quick else ''}"
        f"{' --only ' + ' '.join(args.only) if set(args.only) != set(SECTIONS) else ''}"
        " — ratios are within this run",
        figures,
    )
    console.print(f"written to {write_json(args.json, about, figures)}")


def _about(
    started: float, size: dict[str, Any], sections: set[str], wrk: str | None
) -> dict[str, Any]:
    """What the JSON says about the run beside its figures."""
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "bench", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": time.time() - started,
        "sizes": size,
        "sections": sorted(sections),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": os.getloadavg()[0],
            "python": platform.python_version(),
        },
        "spark": {
            "checkpointFileManagerClass": FAST_CHECKPOINTS,
            "jvm_options": JVM_OPTIONS,
            "master": "local[2]",
            "rebuild also on": f"standalone cluster, {spark_standalone.WORKERS} workers x 1 core",
        },
        "load_tool": "wrk" if wrk else "python (aiohttp)",
    }


def _memory_figures(memory: dict[str, PeakRss]) -> list[Figure]:
    """Peak memory of the instances measured above: PSS, which counts each page of the
    instance's processes once (what they take from the machine), against the target, and the
    RSS summed over the processes beside it, which counts every shared page (libraries, the
    memory forked Spark workers share with the daemon they came from) once per process."""
    pss = {
        label: {"PSS": p.peak_pss, **{f"PSS {k}": v for k, v in sorted(p.split.items())}}
        for label, p in memory.items()
    }
    return [
        Figure(
            "peak memory of one instance (JVM + Python workers + API), PSS",
            max(p.peak_pss for p in memory.values()) / GB,
            "GB",
            target=("<=", 1.5),
            absolute=True,
            note="; ".join(
                f"{label}: {p.peak_pss / GB:.2f} GB ("
                + ", ".join(f"{k} {v / GB:.2f}" for k, v in sorted(p.split.items()))
                + ")"
                for label, p in memory.items()
            ),
            details=pss,
        ),
        Figure(
            "peak RSS of one instance, summed over its processes",
            max(p.peak for p in memory.values()) / GB,
            "GB",
            note="info: shared pages counted once per process; "
            + "; ".join(f"{label}: {p.peak / GB:.2f} GB" for label, p in memory.items()),
            details={label: p.peak for label, p in memory.items()},
        ),
    ]


def _lookups(run: BenchRun, bootstrap: str) -> list[Figure]:
    """A queryable topic (``LatestValue``) of ``lookup_keys`` keys, served by an instance."""
    keys = run.size["lookup_keys"]
    ensure_topics(
        bootstrap,
        [TopicSpec("supplier.prices", PARTITIONS), TopicSpec("supplier.ratings", PARTITIONS)],
    )
    # librdkafka's default partitioner is the store's declared "consistent" (CRC32).
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 500_000}
    )

    def load() -> None:
        for n in range(keys):
            produce_when_room(
                producer,
                "supplier.prices",
                key=b"k-%07d" % n,
                value=b'{"price":%d.%02d,"currency":"EUR"}' % (n % 997, n % 100),
            )
        assert producer.flush(120) == 0

    run.step(f"producing {keys:,} keys to a queryable topic", load)
    setup = lookups.LookupSetup(
        state_dir=run.tmp / "prices",
        store="prices",
        partitions=PARTITIONS,
        partitioner="consistent",
        keys=keys,
        key_format="k-%07d",
        seconds=run.size["seconds"],
        rounds=run.size["rounds"],
    )

    def prices_instance(server: str) -> InstanceProcess:
        return InstanceProcess(
            bootstrap=bootstrap,
            state_dir=run.tmp / "prices",
            service="foldstream.examples.prices:service",
            partitions=PARTITIONS,
            server=server,
        )

    instance = prices_instance("uvicorn")
    with instance, PeakRss(pid_of(instance)) as peak:
        started = time.perf_counter()
        run.step(
            f"instance (queryable topic) folding {keys:,} keys",
            lambda: instance.wait_ready(timeout=3600),
        )
        build = keys / (time.perf_counter() - started)
        target = lookups.Target("instance", instance.url, pid_of(instance))
        figures = run.step(
            "lookups: instance vs minimal app vs variants",
            lambda: lookups.lookup_figures(run.wrk, target, setup),
        )
    run.memory["instance serving a queryable topic"] = peak
    figures.append(
        Figure(
            f"queryable topic loaded into a fresh instance, {keys:,} keys",
            build,
            "keys/s",
            note="info: instance start (JVM, Spark) included",
        )
    )
    # The same stores served by the instance restarted on the other HTTP server.
    on_granian = prices_instance("granian")
    with on_granian:
        run.step("instance restarted with --server granian", on_granian.wait_ready)
        target = lookups.Target("instance on granian", on_granian.url, pid_of(on_granian))
        figures.insert(
            1,
            run.step(
                "lookups: instance on granian vs minimal app",
                lambda: lookups.instance_on_granian_figure(run.wrk, target, setup),
            ),
        )
    return figures  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
