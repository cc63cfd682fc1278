"""The broker the rest of the run stands on: how long ``foldstream broker`` takes to answer
(one node, and three replicating each other), and its nodes' memory while events are appended.

Reference: the JVM alone (``java -version``) on the same machine, the part of a start no
broker setting can cut.
"""

from __future__ import annotations

import functools
import subprocess
import time

from bench.procs import PeakRss
from bench.report import Figure
from bench.run import BenchRun
from bench.workload import inventory_events, produce
from foldstream.broker import KafkaCluster
from foldstream.java import find_java
from foldstream.kafka import TopicSpec, ensure_topics

MB = 1e6


def _jvm_start_s() -> float:
    java, _ = find_java("the bench")
    started = time.perf_counter()
    subprocess.run([java, "-version"], capture_output=True, check=True, timeout=60)
    return time.perf_counter() - started


def _started(brokers: int) -> tuple[KafkaCluster, float]:
    cluster = KafkaCluster(brokers=brokers)
    started = time.perf_counter()
    cluster.start()
    return cluster, time.perf_counter() - started


def broker_figures(run: BenchRun) -> list[Figure]:
    """Start times of 1 and 3 nodes beside the JVM's own, and each node's peak RSS while
    ``run.size["events"]`` events are appended (replicated 3 times on 3 nodes)."""
    jvm = run.step("reference: the JVM alone (java -version)", _jvm_start_s)
    figures = []
    for brokers in (1, 3):
        cluster, seconds = run.step(
            f"starting {brokers} Kafka node(s)", functools.partial(_started, brokers)
        )
        try:
            figures.append(
                Figure(
                    f"foldstream broker --brokers {brokers}: start until every node answers",
                    seconds,
                    "s",
                    reference=jvm,
                    reference_name="java -version",
                )
            )
            figures.append(_memory_figure(run, cluster, brokers))
        finally:
            cluster.stop()
    return figures


def _memory_figure(run: BenchRun, cluster: KafkaCluster, brokers: int) -> Figure:
    topic = "bench-broker.events"
    ensure_topics(cluster.bootstrap, [TopicSpec(topic, 6)], replication_factor=brokers)
    samplers = [PeakRss(pid).__enter__() for pid in cluster.pids]
    try:
        events = run.size["events"]
        run.step(
            f"appending {events:,} events to {brokers} node(s)",
            lambda: produce(cluster.bootstrap, topic, inventory_events(run.size["keys"], events)),
        )
    finally:
        for sampler in samplers:
            sampler.__exit__(None, None, None)
    peaks = [s.peak for s in samplers]
    return Figure(
        f"a Kafka node's peak RSS while {run.size['events']:,} events are appended "
        f"({brokers} node(s), heap bounded)",
        max(peaks) / MB,
        "MB",
        details={"per node MB": [round(p / MB, 1) for p in peaks]},
    )
