"""foldstream's own membership against Kafka's group protocol (KIP-848), in the same run:
``python -m bench.membership [--reps N] [--session-ms MS] [--json PATH]``.

One Apache Kafka node (``KafkaCluster``) serves both designs, with the group settings an
operator would give it for KIP-848 at the home-made protocol's figures: a 3 s session timeout
(``group.consumer.session.timeout.ms``, its minimum lowered from 45 s), a 0.5 s heartbeat
interval (``group.consumer.heartbeat.interval.ms``, minimum lowered from 5 s) and no batching of
assignments (``group.consumer.assignment.interval.ms=0``). Each member is a process of its own
(:mod:`bench.membership_member`), so that ``kill -9``, ``SIGSTOP`` and ``SIGCONT`` hit it alone.

Each repetition runs each design once on topics of its own (6 partitions), the two designs in
alternating order (ABBA), through the same phases:

a. **convergence**: 3 members told to start at the same moment; the time until every partition
   has exactly one owner (by the members' own reports) and every member's view of the owners
   agrees;
b. **failover**: ``kill -9`` of one member (the home-made leader, ``m0``, in even repetitions,
   ``m2`` in odd ones); the time until the survivors own its partitions and agree;
c. a replacement member joins (the time until the 3 agree again); then **a pause**: ``SIGSTOP``
   of ``m1`` (the home-made leader in even repetitions, since ``m0`` died; a non-leader in odd
   ones) for 2.5 session timeouts, then ``SIGCONT``: the time until its partitions
   moved, how long after resuming it still claimed partitions others own, its writes then
   (refused as fenced, or committed), owners it fenced, and the time until all agree again.

The figures of a phase are read from the members' reports once it has held for
:data:`HOLD_S` (:mod:`bench.membership_timeline`). The load average is recorded at each phase:
the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from bench.membership_member import PARTITIONS
from bench.membership_timeline import (
    Timeline,
    moved_at,
    settled,
    spread,
    stale_until,
    state_at,
    writes,
)
from foldstream.broker import KafkaCluster
from foldstream.kafka import producer_config
from foldstream.kafka_topics import TopicSpec, ensure_topics
from foldstream.process import PARENT_PID_ENV

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = ("homemade", "kip848")
#: How long a phase's outcome must hold before it counts (and the next phase starts).
HOLD_S = 2.0
#: A phase not over after this long is reported as not reached.
PHASE_TIMEOUT_S = 60.0
#: How long the paused member stands still, in session timeouts.
PAUSE_SESSIONS = 2.5


def broker_properties(session_ms: int) -> dict[str, str]:
    """KIP-848's group settings at the home-made protocol's session timeout and heartbeat."""
    return {
        "group.consumer.session.timeout.ms": str(session_ms),
        "group.consumer.min.session.timeout.ms": str(min(session_ms, 1000)),
        "group.consumer.heartbeat.interval.ms": "500",
        "group.consumer.min.heartbeat.interval.ms": "100",
        "group.consumer.assignment.interval.ms": "0",
    }


@dataclass
class Fleet:
    """The member processes of one design in one repetition, and their reports."""

    design: str
    bootstrap: str
    service: str
    scratch: Path
    session_ms: int
    timeline: Timeline = field(default_factory=lambda: Timeline(PARTITIONS))
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    live: set[int] = field(default_factory=set)

    def spawn(self, indices: Collection[int], timeout: float = 120.0) -> float:
        """Start members ``indices``, wait until each is ready, tell them all to start at
        once; returns when (monotonic)."""
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        for n in indices:
            command = [sys.executable, "-m", "bench.membership_member", self.design, str(n)]
            state_dir = self.scratch / f"{self.service}-m{n}"
            command += [self.bootstrap, self.service, str(state_dir), str(self.session_ms)]
            log = (self.scratch / f"{self.service}-m{n}.log").open("wb")
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log,
            )  # fmt: skip
            assert process.stdout is not None
            self.timeline.follow(n, process.stdout)
            self.processes[n] = process
        deadline = time.monotonic() + timeout
        while not all(self.timeline.seen(n, "ready") for n in indices):
            if time.monotonic() > deadline:
                raise RuntimeError(f"members {sorted(indices)} not ready: see {self.scratch}")
            time.sleep(0.05)
        started = time.monotonic()
        for n in indices:
            stdin = self.processes[n].stdin
            assert stdin is not None
            stdin.write(b"go\n")
            stdin.flush()
        self.live.update(indices)
        return started

    def signal(self, index: int, sig: signal.Signals) -> float:
        """Send ``sig`` to member ``index`` (a process this fleet started); returns when."""
        at = time.monotonic()
        os.kill(self.processes[index].pid, sig)
        if sig == signal.SIGKILL:
            self.live.discard(index)
        return at

    def settle(self, since: float, members: Collection[int] | None = None) -> dict[str, Any]:
        """Wait until every partition has one owner among ``members`` (the live ones) that
        they all agree on, held for :data:`HOLD_S`; the seconds since ``since`` each took."""
        members = set(self.live if members is None else members)
        deadline = since + PHASE_TIMEOUT_S
        while time.monotonic() < deadline:
            now = time.monotonic()
            agreed = settled(self.timeline, members, since, now, views=True)
            if agreed is not None and now - agreed.at >= HOLD_S:
                owned = settled(self.timeline, members, since, now, views=False)
                return {
                    "agreed_s": agreed.at - since,
                    "owned_s": None if owned is None else owned.at - since,
                    "flaps": agreed.flaps,
                }
            time.sleep(0.05)
        return {"agreed_s": None, "owned_s": None, "flaps": None}

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.wait()
        self.timeline.save(self.scratch / f"{self.service}.jsonl")


def warm_up(bootstrap: str) -> None:
    """Make the broker's transaction and group coordinators ready (their topics created and
    loaded) before anything is measured: a fresh broker answers the first
    ``init_transactions`` only after several seconds of "coordinator load in progress"."""
    topic = f"mb{os.getpid()}-warm-up"
    ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    producer = Producer(producer_config(bootstrap, linger_ms=0, **{"transactional.id": topic}))
    producer.init_transactions(120)
    producer.begin_transaction()
    producer.produce(topic, value=b"warm")
    producer.commit_transaction(120)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "group.protocol": "consumer"}
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 120
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    consumer.close()


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def failover(fleet: Fleet, victim: int) -> dict[str, Any]:
    ring = sorted(fleet.live)
    owned = state_at(fleet.timeline, time.monotonic()).owned
    killed = fleet.signal(victim, signal.SIGKILL)
    result = fleet.settle(killed)
    until = time.monotonic()
    moved = moved_at(fleet.timeline, owned.get(victim, ()), fleet.live, killed, until)
    after = state_at(fleet.timeline, until).single_owners(fleet.live, PARTITIONS) or {}
    # A design whose assignment the broker makes keeps its standby copies where a deterministic
    # function of the members puts them: the next member after the owner, in id order.
    standby = ring[(ring.index(victim) + 1) % len(ring)]
    return {
        **result,
        "victim": victim,
        "moved_s": None if moved is None else moved - killed,
        "to_ring_standby": sum(1 for p in owned.get(victim, ()) if after.get(p) == standby),
        "victim_partitions": len(owned.get(victim, ())),
        "writes": writes(fleet.timeline, fleet.live, killed, until),
    }


def pause(fleet: Fleet, target: int) -> dict[str, Any]:
    held = state_at(fleet.timeline, time.monotonic()).owned.get(target, frozenset())
    others = fleet.live - {target}
    stopped = fleet.signal(target, signal.SIGSTOP)
    time.sleep(PAUSE_SESSIONS * fleet.session_ms / 1000)
    resumed = fleet.signal(target, signal.SIGCONT)
    moved = moved_at(fleet.timeline, held, others, stopped, resumed)
    result = fleet.settle(resumed)
    until = time.monotonic()
    stale = stale_until(fleet.timeline, target, fleet.live, resumed, until)
    return {
        **result,
        "target": target,
        "held": len(held),
        "moved_s": None if moved is None else moved - stopped,
        "stale_after_resume_s": None if stale is None else stale - resumed,
        "writes": writes(fleet.timeline, fleet.live, resumed, until),
    }


def repetition(design: str, rep: int, bootstrap: str, scratch: Path, session_ms: int) -> dict:
    service = f"mb{os.getpid()}r{rep}{design[0]}"
    topics = [TopicSpec(f"{service}.{name}", PARTITIONS) for name in ("events", "writes")]
    ensure_topics(bootstrap, [*topics, TopicSpec(f"{service}.cluster", 1, compact=True)])
    fleet = Fleet(design, bootstrap, service, scratch, session_ms)
    result: dict[str, Any] = {"design": design, "rep": rep}
    try:
        result["load_start"] = load_average()
        started = fleet.spawn([0, 1, 2])
        result["convergence"] = fleet.settle(started)
        result["convergence"]["writes"] = writes(
            fleet.timeline, {0, 1, 2}, started, time.monotonic()
        )
        result["load_failover"] = load_average()
        result["failover"] = failover(fleet, victim=0 if rep % 2 == 0 else 2)
        joined = fleet.spawn([3])
        result["join"] = fleet.settle(joined)
        result["load_pause"] = load_average()
        result["pause"] = pause(fleet, target=1)
    finally:
        fleet.close()
    return result


def summary(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each design's medians and spread of the figures of every phase."""
    figures = {
        "convergence (agreed)": ("convergence", "agreed_s"),
        "convergence (owned)": ("convergence", "owned_s"),
        "failover (agreed)": ("failover", "agreed_s"),
        "failover (moved)": ("failover", "moved_s"),
        "join (agreed)": ("join", "agreed_s"),
        "pause: moved after stop": ("pause", "moved_s"),
        "pause: stale after resume": ("pause", "stale_after_resume_s"),
        "pause: agreed after resume": ("pause", "agreed_s"),
    }
    table: dict[str, dict[str, Any]] = {}
    for design in DESIGNS:
        mine = [r for r in results if r["design"] == design]
        table[design] = {
            name: spread(r.get(phase, {}).get(key) for r in mine)
            for name, (phase, key) in figures.items()
        }
        # The home-made protocol's leader (the smallest id) failing costs a role change: its
        # figures apart. The member killed, and the one paused, lead in even repetitions.
        for role, parity in (("leader", 0), ("non-leader", 1)):
            reps = [r for r in mine if r["rep"] % 2 == parity]
            table[design][f"failover (agreed), {role} killed"] = spread(
                r.get("failover", {}).get("agreed_s") for r in reps
            )
            table[design][f"pause: moved after stop, {role} paused"] = spread(
                r.get("pause", {}).get("moved_s") for r in reps
            )
        table[design]["load average"] = spread(
            r[k] for r in mine for k in ("load_start", "load_failover", "load_pause") if k in r
        )
        for phase in ("convergence", "failover", "pause"):
            counts = (r[phase]["writes"] for r in mine if phase in r)
            table[design][f"{phase} writes"] = _summed(counts)
        table[design]["failover to the ring's standby"] = _summed(
            {k: r["failover"][k] for k in ("to_ring_standby", "victim_partitions")}
            for r in mine
            if "failover" in r
        )
    return table


def _summed(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for key, value in count.items():
            total[key] = total.get(key, 0) + value
    return total


def _print(table: dict[str, dict[str, Any]]) -> None:
    names = [n for n, figure in table[DESIGNS[0]].items() if "median" in figure]
    print(f"{'figure (s)':40}" + "".join(f"{d + ': median [min-max] n':>34}" for d in DESIGNS))
    for name in names:
        cells = []
        for design in DESIGNS:
            s = table[design][name]
            cells.append(
                "-" if s["median"] is None
                else f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}] {s['n']}"
                + (f" ({s['missing']} missing)" if s["missing"] else "")
            )  # fmt: skip
        print(f"{name:40}" + "".join(f"{c:>34}" for c in cells))
    for design in DESIGNS:
        for name in (n for n, figure in table[design].items() if "median" not in figure):
            print(f"{design}, {name}: {table[design][name]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--session-ms", type=int, default=3000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="membership-bench-"))
    results = []
    with KafkaCluster(properties=broker_properties(args.session_ms)) as cluster:
        warm_up(cluster.bootstrap)
        for rep in range(args.reps):
            order = DESIGNS if rep % 2 == 0 else DESIGNS[::-1]
            for design in order:
                result = repetition(design, rep, cluster.bootstrap, scratch, args.session_ms)
                print(json.dumps(result), flush=True)
                results.append(result)
    table = summary(results)
    _print(table)
    path = args.json or ROOT / "bench" / "results" / f"membership-{int(time.time())}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"session_ms": args.session_ms, "results": results,
                                "summary": table}, indent=1))  # fmt: skip
    print(f"written to {path}; member logs in {scratch}")


if __name__ == "__main__":
    main()
