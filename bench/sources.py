"""Spark's own Kafka source beside foldstream's Python Data Source (``python -m bench --only
sources``): the same inventory events, the same fold of ``stock`` into the same store host
(values and source offset in one RocksDB write batch, the changelog acknowledged first), in
the same Spark session (``local[2]``), only the reading differs (:mod:`bench.spark_kafka`).

- **Rebuild:** events/s folding a topic of ``source_events`` events, appended in transactions
  as the command side appends them, from offset 0 into empty stores, until every partition's
  last event is in its store; values checked against the events.
- **Freshness:** events appended at ``rate``/s in transactions by another process (group
  commit), each noted with when its transaction committed; visible when the store host wrote
  the partition past its offset (what a lookup then reads). Each run has topics of its own;
  the query first folds one event (the time it took from the query's start is reported: a
  Kafka source query must be restarted whenever the instance's partitions change), then
  ``warm-up`` seconds of events are not counted.

Each round runs every design, in the other order every other round, so that the machine's
load, shared with other work, falls on each alike; the figures are the medians over rounds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import statistics
import time
from collections.abc import Iterator, Mapping
from multiprocessing.pool import Pool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.inventory import PARTITIONS
from bench.procs import CpuMeter, process_tree
from bench.rebuild import check_stock
from bench.report import Figure
from bench.run import BenchRun
from bench.source_designs import (
    FRESHNESS_DESIGNS,
    KAFKA,
    KAFKA_ONE_TASK,
    PYTHON,
    REBUILD_DESIGNS,
    Design,
    RunningProjection,
    projection_settings,
)
from bench.spark_kafka import connector_jars, jars_option, jvm_pid
from bench.transactional_appends import Appended, append_all, append_paced, appender_process
from foldstream.settings import Settings
from foldstream.spark import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: How long a run may take to fold what was appended before it counts as failed.
CATCH_UP_S = 600.0
#: How long a new query may take to fold its first event.
FIRST_EVENT_S = 300.0
WARM_UP_S = 2.0
FRESHNESS_KEYS = 2_000


@contextlib.contextmanager
def cpu_spent(spark: SparkSession) -> Iterator[dict[str, float]]:
    """CPU seconds spent inside, by where: the session's JVM, its Python workers, this process
    (the store host, the driver's Python side), and apart from those the Kafka nodes this
    process started (``broker``); filled in on exit."""
    spent: dict[str, float] = {}
    bench = time.process_time()
    with CpuMeter(jvm_pid(spark)) as jvm, contextlib.ExitStack() as stack:
        brokers = [stack.enter_context(CpuMeter(pid)) for pid in _broker_pids()]
        yield spent
    spent["jvm"] = jvm.root_seconds
    spent["python workers"] = jvm.seconds - jvm.root_seconds
    spent["bench process"] = time.process_time() - bench
    spent["broker"] = sum(meter.seconds for meter in brokers)


def _broker_pids() -> list[int]:
    """The Kafka nodes among this process's children (:class:`~foldstream.broker.KafkaCluster`
    runs each as ``java ... kafka.Kafka``)."""
    found = []
    for pid in process_tree(os.getpid()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"\0kafka.Kafka\0" in command:
            found.append(pid)
    return found


def _spark_cpu(spent: Mapping[str, float]) -> float:
    """The CPU seconds of the projection: all but the broker's."""
    return sum(seconds for where, seconds in spent.items() if where != "broker")


def rebuild_once(
    run: BenchRun,
    spark: SparkSession,
    design: Design,
    events_settings: Settings,
    last: Mapping[int, int],
) -> dict[str, Any]:
    """One rebuild of ``events_settings``' topic by ``design`` into empty stores, from the
    query's start until every partition's last event is stored."""
    state = run.tmp / f"rebuild-{len(os.listdir(run.tmp))}"
    projection = RunningProjection(
        spark, design, dataclasses.replace(events_settings, state_dir=state)
    )
    load = os.getloadavg()[0]
    try:
        with cpu_spent(spark) as spent:
            started = time.monotonic()
            projection.start()
            done = projection.seen.wait_for(last, CATCH_UP_S)
    finally:
        projection.stop()
    events = run.size["source_events"]
    check_stock(state, PARTITIONS, run.size["source_keys"], events)
    shutil.rmtree(state)
    return {
        "events/s": events / (done - started),
        "seconds": done - started,
        "events/CPU-s": events / _spark_cpu(spent),
        "load 1m": load,
        **{f"cpu s: {k}": v for k, v in spent.items()},
    }


def started_on_new_topics(
    run: BenchRun, spark: SparkSession, design: Design, bootstrap: str
) -> tuple[RunningProjection, float]:
    """``design``'s query on topics of its own, once it folded a first event; and how long
    that took from its start (s)."""
    settings = projection_settings(run, f"fresh-{len(os.listdir(run.tmp))}", bootstrap)
    projection = RunningProjection(spark, design, settings)
    started = time.monotonic()
    try:
        projection.start()
        first = append_all(bootstrap, settings.events_topic, FRESHNESS_KEYS, 1)
        return projection, projection.seen.wait_for(first, FIRST_EVENT_S) - started
    except BaseException:
        projection.stop()
        raise


def warm_up(run: BenchRun, spark: SparkSession, design: Design, bootstrap: str) -> float:
    """Start ``design``'s query once and stop it, uncounted: the session's first query of a
    kind pays for loading its classes, compiling its code and starting its workers."""
    projection, first = started_on_new_topics(run, spark, design, bootstrap)
    projection.stop()
    return first


def freshness_once(
    run: BenchRun, spark: SparkSession, design: Design, appender: Pool, bootstrap: str
) -> dict[str, Any]:
    """One freshness run of ``design`` on topics of its own (the module's docstring)."""
    rate, seconds = run.size["rate"], run.size["source_fresh_seconds"]
    load = os.getloadavg()[0]
    projection, first = started_on_new_topics(run, spark, design, bootstrap)
    topic = projection.settings.events_topic
    try:
        with cpu_spent(spark) as spent:
            pacing = time.monotonic()
            appended: list[Appended] = appender.apply(
                append_paced,
                (
                    projection.settings.bootstrap_servers,
                    topic,
                    FRESHNESS_KEYS,
                    rate,
                    WARM_UP_S + seconds,
                ),
            )
            paced = time.monotonic() - pacing
        last: dict[int, int] = {}
        for partition, offset, _ in appended:
            last[partition] = max(offset, last.get(partition, -1))
        projection.seen.wait_for(last, CATCH_UP_S)
        batch_ms = projection.batch_ms()
    finally:
        projection.stop()
    counted = [a for a in appended if a[2] >= pacing + WARM_UP_S]
    lags = sorted(
        (projection.seen.visible_at(p, offset) or float("inf")) - acked
        for p, offset, acked in counted
    )
    return {
        "p50 ms": lags[len(lags) // 2] * 1e3,
        "p99 ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1e3,
        "events": len(counted),
        "achieved rate": len(appended) / paced,
        "cores": _spark_cpu(spent) / paced,
        "broker cores": spent["broker"] / paced,
        "batch ms": batch_ms,
        "first event visible s": first,
        "load 1m": load,
        **{f"cpu s: {k}": v for k, v in spent.items()},
    }


def sources_figures(run: BenchRun, bootstrap: str) -> list[Figure]:
    """Both designs' rebuild and freshness, alternated over ``source_rounds`` rounds."""
    jars = run.step("Spark's Kafka connector (Maven, first use only)", connector_jars)
    spark = run.step(
        "starting Spark (local[2]) with the Kafka connector",
        lambda: spark_session("local[2]", "bench-sources", conf=jars_option(jars)),
    )
    events, keys = run.size["source_events"], run.size["source_keys"]
    rebuilds: dict[Design, list[dict[str, Any]]] = {d: [] for d in REBUILD_DESIGNS}
    fresh: dict[Design, list[dict[str, Any]]] = {d: [] for d in FRESHNESS_DESIGNS}
    try:
        for design in FRESHNESS_DESIGNS:
            first = run.step(
                f"warming up: {design.name}",
                functools.partial(warm_up, run, spark, design, bootstrap),
            )
            run.console.print(f"[dim]  first event visible after {first:.1f}s")
        source = projection_settings(run, "sources", bootstrap)
        last = run.step(
            f"appending {events:,} events over {keys:,} products in transactions",
            lambda: append_all(bootstrap, source.events_topic, keys, events),
        )
        with appender_process() as appender:
            for turn in range(run.size["source_rounds"]):
                for design in _ordered(REBUILD_DESIGNS, turn):
                    rebuilds[design].append(
                        run.step(
                            f"round {turn + 1}: rebuild, {design.name}",
                            functools.partial(rebuild_once, run, spark, design, source, last),
                        )
                    )
                    _say(run, rebuilds[design][-1], "events/s", "events/CPU-s")
                for design in _ordered(FRESHNESS_DESIGNS, turn):
                    fresh[design].append(
                        run.step(
                            f"round {turn + 1}: freshness at {run.size['rate']:.0f}/s, "
                            f"{design.name}",
                            functools.partial(
                                freshness_once, run, spark, design, appender, bootstrap
                            ),
                        )
                    )
                    _say(run, fresh[design][-1], "p50 ms", "p99 ms", "cores", "batch ms")
    finally:
        spark.stop()
    return _figures(run, rebuilds, fresh)


def _ordered(designs: tuple[Design, ...], turn: int) -> tuple[Design, ...]:
    return designs if turn % 2 == 0 else designs[::-1]


def _say(run: BenchRun, measured: Mapping[str, Any], *names: str) -> None:
    shown = ", ".join(f"{name} {measured[name]:,.2f}" for name in (*names, "load 1m"))
    run.console.print(f"[dim]  {shown}")


#: The figures: (what, the measurement's name, unit, the designs compared with foldstream's).
REBUILD_FIGURES = (
    ("rebuild ev/s", "events/s", "ev/s"),
    ("rebuild ev per CPU-second (JVM, Python workers, store host)", "events/CPU-s", "ev/CPU-s"),
)
FRESHNESS_FIGURES = (
    ("freshness p50", "p50 ms", "ms"),
    ("freshness p99", "p99 ms", "ms"),
    ("cores used while appending", "cores", "cores"),
    ("broker cores while appending", "broker cores", "cores"),
    ("query start to first event stored", "first event visible s", "s"),
)


def _figures(
    run: BenchRun,
    rebuilds: Mapping[Design, list[dict[str, Any]]],
    fresh: Mapping[Design, list[dict[str, Any]]],
) -> list[Figure]:
    """Each design's median over the rounds beside foldstream's, with the ratio of each round
    (both measured in it) and the machine's load."""
    loads = [r["load 1m"] for runs in (*rebuilds.values(), *fresh.values()) for r in runs]
    about = f"load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores"
    events, rate = run.size["source_events"], run.size["rate"]
    figures = [
        _figure(f"{what}, {events:,} events", name, unit, rebuilds, KAFKA, about)
        for what, name, unit in REBUILD_FIGURES
    ]
    figures += [
        _figure(f"{what} at {rate:.0f} ev/s", name, unit, fresh, design, about)
        for what, name, unit in FRESHNESS_FIGURES
        for design in (KAFKA, KAFKA_ONE_TASK)
    ]
    return figures


def _figure(
    what: str,
    name: str,
    unit: str,
    measured: Mapping[Design, list[dict[str, Any]]],
    design: Design,
    about: str,
) -> Figure:
    ours, theirs = measured[PYTHON], measured[design]
    ratios = sorted(t[name] / o[name] for t, o in zip(theirs, ours, strict=True) if o[name])
    return Figure(
        f"{what}: {design.name}",
        statistics.median(r[name] for r in theirs),
        unit,
        statistics.median(r[name] for r in ours),
        PYTHON.name,
        note=f"info: median of {len(ours)} rounds; ratio per round "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f"; {about}",
        details={d.name: measured[d] for d in (design, PYTHON)},
    )
