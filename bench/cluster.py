"""Cluster figures: redirect-on-miss cost, failover time and restore-from-changelog rate.

Three instances of the storefront example share a queryable topic of ``keys`` keys. The
redirect figure compares the server CPU per lookup (every instance's API process, idle CPU
subtracted) of a client sending half its lookups to a non-owner that answers 307 against a
smart client that routes by the published cluster map, at the same lookup rate.
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

    def per_request(
        self, urls: list[str], *, seconds: float = 3.0, rate: float | None = None
    ) -> tuple[list[float], float]:
        """Server CPU µs of each API process per GET of ``urls`` (redirects followed), sent
        again and again for ``seconds`` by a load process, as fast as 32 clients can or at
        ``rate``/s (CPU time is counted in 10 ms ticks: short rounds are noise); and the GETs
        per second answered."""
        before, started = [self.cpu([pid]) for pid in self.pids], time.perf_counter()
        done = get_repeatedly(urls, seconds=seconds, rate=rate)
        elapsed = time.perf_counter() - started
        costs = [
            (self.cpu([pid]) - start - self.idle_rates[pid] * elapsed) / done * 1e6
            for pid, start in zip(self.pids, before, strict=True)
        ]
        return costs, done / elapsed


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
        figures += _redirect_figures(api, mixed, mixed_direct)
        figures.append(_failover(instances, sample[:200]))
        figures.append(_restore(bootstrap, tmp, rebuild_rate))
    finally:
        for instance in instances:
            instance.stop()
    return figures


def _redirect_figures(api: _ApiCpu, mixed: list[str], direct: list[str]) -> list[Figure]:
    """Server CPU per lookup of ``mixed`` (half sent to a non-owner, 307 followed) against the
    same keys sent ``direct`` to their owners, in alternated rounds (the machine's noise hits
    both sides alike), medians kept.

    A client following redirects answers fewer lookups per second than one going direct (it
    waits for two answers), and an HTTP server spends less CPU per request the more requests
    share each wake-up: compared as fast as each goes, the redirected side pays for that too.
    The target compares both at the same rate, the redirected one's; the as-fast-as-possible
    ratio is printed beside it."""
    rounds = []
    for _ in range(ROUNDS):
        redirected, rate = api.per_request(mixed)
        matched, _ = api.per_request(direct, rate=rate)
        free, free_rate = api.per_request(direct)
        rounds.append(
            {
                "redirected": redirected,
                "direct, same rate": matched,
                "direct, as fast as it goes": free,
                "rates": [rate, free_rate],
            }
        )

    def median(side: str, members: slice = slice(None)) -> float:
        return statistics.median(sum(r[side][members]) for r in rounds)

    redirected, matched, free = (
        median(side) for side in ("redirected", "direct, same rate", "direct, as fast as it goes")
    )
    rate, free_rate = (statistics.median(r["rates"][n] for r in rounds) for n in (0, 1))
    # Per lookup of the whole run: the front answers half the keys on both sides, and a 307
    # for each of the other half on the redirected one; the owners answer that other half.
    front = [median(side, slice(0, 1)) for side in ("direct, same rate", "redirected")]
    owners = [median(side, slice(1, None)) for side in ("direct, same rate", "redirected")]
    keys = f"{len(mixed):,} keys over 3 instances, medians of {ROUNDS} alternated rounds of >= 3 s"
    return [
        Figure(
            "redirect-on-miss cost (server CPU per lookup, half the keys remote)",
            redirected,
            "µs",
            matched,
            "smart client routing by /cluster (direct to owner), at the same lookup rate",
            ("<=", 1.35),
            note=f"{keys}; all instances' API processes; {rate:,.0f} lookups/s both sides "
            f"(32 keep-alive clients following redirects as fast as they can, in a separate "
            f"process; the direct side paced to their rate). Per lookup, direct → redirected: "
            f"the front {front[0]:.0f} → {front[1]:.0f} µs (the 307s), the two owners "
            f"{owners[0]:.0f} → {owners[1]:.0f} µs",
            details={
                "rounds (µs per lookup of front, owner, owner; lookups/s)": rounds,
                "front: µs per lookup (direct, redirected)": front,
                "owners: µs per lookup (direct, redirected)": owners,
            },
        ),
        Figure(
            "redirect-on-miss cost, each side as fast as it goes",
            redirected,
            "µs",
            free,
            f"smart client at {free_rate:,.0f} lookups/s vs {rate:,.0f} following redirects",
            note="info: the direct side's higher rate lowers its CPU per request (more "
            "requests per wake-up)",
        ),
    ]


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
