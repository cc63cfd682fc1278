"""Cluster figures: redirect-on-miss cost, failover time and restore-from-changelog rate.

Three instances of the storefront example share a queryable topic of ``keys`` keys. The
redirect figure compares the server CPU per lookup (every instance's API process, idle CPU
subtracted) of a client sending half its lookups to a non-owner that answers 307 against a
smart client that routes by the published cluster map.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path

from confluent_kafka import Producer

from bench.http_client import Connections, get_repeatedly
from bench.procs import cpu_seconds
from bench.report import Figure
from foldstream.changelog import StoreLayout, restore
from foldstream.examples.storefront import RATINGS_TOPIC
from foldstream.kafka import (
    TopicSpec,
    ensure_topics,
    partition_for,
    produce_when_room,
    producer_config,
)
from foldstream.process import InstanceProcess, http, wait_cluster_stable

PARTITIONS = 6
SESSION_TIMEOUT_S = 3.0
ROUNDS = 3
FAILOVER_PROBES = 16  # concurrent


def _load_ratings(bootstrap: str, keys: int) -> None:
    producer = Producer(producer_config(bootstrap, linger_ms=20))  # murmur2, like Java clients
    for n in range(keys):
        produce_when_room(producer, RATINGS_TOPIC, key=b"v-%07d" % n, value=b"%d stars" % (n % 5))
    assert producer.flush(120) == 0


class _ApiCpu:
    """Server CPU of the instances' API processes, their idle rate (background threads: map
    heartbeats, standby copies, idle micro-batch triggers) measured once and subtracted."""

    def __init__(self, instances: list[InstanceProcess], idle_s: float = 3.0) -> None:
        self.pids = [i.process.pid for i in instances if i.process is not None]
        starts, started = {pid: self.cpu([pid]) for pid in self.pids}, time.perf_counter()
        time.sleep(idle_s)
        elapsed = time.perf_counter() - started
        self.idle_rates = {pid: (self.cpu([pid]) - s) / elapsed for pid, s in starts.items()}

    def cpu(self, pids: list[int] | None = None) -> float:
        return sum(cpu_seconds(pid, tree=False) for pid in (pids or self.pids))

    def per_request(self, urls: list[str], *, seconds: float = 3.0) -> list[float]:
        """Server CPU µs of each API process per GET of ``urls`` (redirects followed), sent
        again and again for ``seconds`` by a load process (CPU time is counted in 10 ms ticks:
        short rounds are noise)."""
        before, started = [self.cpu([pid]) for pid in self.pids], time.perf_counter()
        done = get_repeatedly(urls, seconds=seconds)
        elapsed = time.perf_counter() - started
        return [
            (self.cpu([pid]) - start - self.idle_rates[pid] * elapsed) / done * 1e6
            for pid, start in zip(self.pids, before, strict=True)
        ]


def _owners(instance: InstanceProcess) -> dict[int, str]:
    _, view = http("GET", f"{instance.url}/cluster")
    return {int(p): e["active"] for p, e in view["partitions"][RATINGS_TOPIC].items()}


def cluster_figures(
    bootstrap: str, tmp: Path, keys: int, lookups: int, rebuild_rate: float | None
) -> list[Figure]:
    ensure_topics(bootstrap, [TopicSpec(RATINGS_TOPIC, PARTITIONS)])
    _load_ratings(bootstrap, keys)
    instances = [
        InstanceProcess(
            bootstrap=bootstrap,
            state_dir=tmp / f"cluster-{n}",
            service="foldstream.examples.storefront:service",
            partitions=PARTITIONS,
            session_timeout_ms=int(SESSION_TIMEOUT_S * 1000),
        )
        for n in range(3)
    ]
    figures: list[Figure] = []
    try:
        for instance in instances:
            instance.start()
        for instance in instances:
            instance.wait_ready(timeout=600)
        wait_cluster_stable(instances, timeout=600)
        owners = _owners(instances[0])
        rng = random.Random(7)
        sample = [b"v-%07d" % rng.randrange(keys) for _ in range(lookups)]
        path = "/stores/ratings/keys/"
        front = instances[0].url
        local = [k for k in sample if owners[partition_for(k, PARTITIONS)] == front]
        remote = [k for k in sample if owners[partition_for(k, PARTITIONS)] != front]
        half = min(len(local), len(remote))
        chosen = local[:half] + remote[:half]
        mixed = [front + path + k.decode() for k in chosen]
        mixed_direct = [owners[partition_for(k, PARTITIONS)] + path + k.decode() for k in chosen]
        api = _ApiCpu(instances)
        # Alternated rounds, medians kept: the machine's noise hits both sides alike.
        rounds = [(api.per_request(mixed_direct), api.per_request(mixed)) for _ in range(ROUNDS)]
        smart = statistics.median(sum(r[0]) for r in rounds)
        redirected = statistics.median(sum(r[1]) for r in rounds)
        # The front answers the local half of the keys in both rounds, and a 307 for each
        # remote one in the redirected rounds: per key sent to it, the difference is a 307.
        front_direct = statistics.median(r[0][0] for r in rounds)
        front_redirected = statistics.median(r[1][0] for r in rounds)
        per_found = 2 * front_direct
        per_307 = 2 * (front_redirected - front_direct)
        owner_cost = [statistics.median(sum(r[side][1:]) for r in rounds) for side in (0, 1)]
        figures.append(
            Figure(
                "redirect-on-miss cost (server CPU per lookup, half the keys remote)",
                redirected,
                "µs",
                smart,
                "smart client routing by /cluster (direct to owner)",
                ("<=", 1.35),
                note=f"{len(mixed):,} keys over 3 instances, medians of {ROUNDS} alternated "
                "rounds of >= 3 s; all instances' API processes; load: 32 keep-alive clients "
                f"in a separate process. In the same rounds the front spent {per_307:.0f} µs "
                f"per 307 and {per_found:.0f} µs per key it answered (one more HTTP request, "
                f"{per_307 / per_found:.0%} of a lookup), which alone puts the ratio at "
                f"1 + {per_307:.0f} / {per_found:.0f} / 2 = {1 + per_307 / per_found / 2:.2f}; "
                f"the owners spent {owner_cost[0]:.0f} → {owner_cost[1]:.0f} µs per lookup "
                "(the same keys at the lower rate of a client waiting for two answers: fewer "
                "requests share each wake-up)",
                details={
                    "rounds (µs per lookup of front, owner, owner: smart, redirected)": rounds,
                    "front: µs per 307": per_307,
                    "front: µs per key answered": per_found,
                    "owners: µs per lookup (smart, redirected)": owner_cost,
                    "the 307s alone: 1 + (307 / key answered) / 2": 1 + per_307 / per_found / 2,
                },
            )
        )
        figures.append(_failover(instances, sample[:200]))
        figures.append(_restore(bootstrap, tmp, rebuild_rate))
    finally:
        for instance in instances:
            instance.stop()
    return figures


def _failover(instances: list[InstanceProcess], sample: list[bytes]) -> Figure:
    victim, survivors = instances[0], instances[1:]
    expected = {k: f"{int(k[2:]) % 5} stars" for k in sample}
    killed_at = time.monotonic()
    victim.kill()
    pending = {(s.url, k) for s in survivors for k in expected}
    passes = asyncio.run(_until_answered(pending, expected, killed_at + 120))
    took = time.monotonic() - killed_at
    return Figure(
        "failover: kill -9 of 1 of 3 instances → all keys answerable",
        None if pending else took,
        "s",
        SESSION_TIMEOUT_S,
        "membership session timeout",
        ("<=", 2.0),
        note=f"{len(sample)} keys checked from both survivors, {FAILOVER_PROBES} at a time "
        f"({passes} passes); 1 standby",
    )


async def _until_answered(
    pending: set[tuple[str, bytes]], expected: dict[bytes, str], deadline: float
) -> int:
    """GET every ``(member URL, key)`` of ``pending`` (following redirects), concurrently, pass
    after pass, until each answered its expected value (then it leaves ``pending``) or
    ``deadline`` (monotonic) passed; the number of passes. Concurrent, so that a pass — the
    resolution of the figure — stays short while the survivors are busy taking over."""

    async def probe(share: list[tuple[str, bytes]]) -> None:
        connections = Connections()
        try:
            for url, key in share:
                try:
                    status, body = await asyncio.wait_for(
                        connections.get(f"{url}/stores/ratings/keys/{key.decode()}"), 5
                    )
                except (OSError, TimeoutError):
                    connections.close()  # a request cut short leaves its connection unusable
                    continue
                if status == 200:
                    assert json.loads(body)["value"] == expected[key], body
                    pending.discard((url, key))
        finally:
            connections.close()

    passes = 0
    while pending and time.monotonic() < deadline:
        passes += 1
        ordered = sorted(pending)
        await asyncio.gather(*(probe(ordered[n::FAILOVER_PROBES]) for n in range(FAILOVER_PROBES)))
    return passes


def _restore(bootstrap: str, tmp: Path, rebuild_rate: float | None) -> Figure:
    layout = StoreLayout(RATINGS_TOPIC, "storefront.ratings.changelog")
    started = time.perf_counter()
    records = sum(
        restore(
            bootstrap=bootstrap,
            state_dir=tmp / "restored",
            store="ratings",
            layout=layout,
            partition=p,
        )
        for p in range(PARTITIONS)
    )
    rate = records / (time.perf_counter() - started)
    return Figure(
        "restore from changelog events/s",
        rate,
        "rec/s",
        rebuild_rate,
        "the projection rebuild rate above",
        (">=", 0.8),
        note=f"{records:,} changelog records into an empty state directory, 1 process",
        details={"records": records},
    )
