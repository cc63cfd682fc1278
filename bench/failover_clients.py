"""What clients see through a failover (``python -m bench --only failover_clients``): redirects
into the dead member, and how soon reads allowing a lag are answered again.

Three inventory instances (session timeout 3 s, suspects after 1 s, one standby copy) on a
broker of their own hold :data:`KEYS` products. The cluster features' query load
(:class:`~foldstream.testing.query_load.QueryLoad`) asks every instance for every key, as a
client following redirects would, each key once without ``max_lag`` and once with
:data:`MAX_LAG`; then the owner of the first key is killed with ``kill -9``. Per run:

- redirects into the dead member for reads sent after it was reaped (its sockets closed), and
  those in flight at the kill (sent before: the redirect was right when it was answered);
- the time from the kill until every survivor answered a read with ``max_lag`` of each of the
  dead member's partitions again (the load's rounds are the resolution);
- the time until every survivor answered every key without ``max_lag`` (the takeover), and the
  statuses the load saw.

The killed member is started again between runs, once the cluster is stable.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.report import Figure
from bench.run import BenchRun
from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.testing.cluster_steps import Store
from foldstream.testing.query_load import QueryLoad

SERVICE = "foldstream.examples.inventory:service"
PARTITIONS = 4
KEYS = 40
MAX_LAG = 1000
#: The time a later issue asks reads allowing a lag to be answered again within.
STANDBY_READ_TARGET_S = 1.5
LONGEST_S = 600.0


def failover_client_figures(run: BenchRun) -> list[Figure]:
    runs = 2 if run.size["rounds"] == 1 else 5
    with KafkaCluster() as broker:
        members = [
            InstanceProcess(
                bootstrap=broker.bootstrap,
                state_dir=run.tmp / f"failover-{n}",
                service=SERVICE,
                partitions=PARTITIONS,
            )
            for n in range(3)
        ]
        try:
            for member in members:
                member.start()
            run.step("starting 3 inventory instances", lambda: _ready(members))
            expected = run.step("writing the products", lambda: _write(members[0]))
            results = [
                run.step(f"failover {n + 1} of {runs}", lambda: _failover(members, expected))
                for n in range(runs)
            ]
        finally:
            for member in members:
                member.stop()
    return _figures(results)


def _ready(members: list[InstanceProcess]) -> None:
    for member in members:
        if member.process is None:
            member.start()
    for member in members:
        member.wait_ready(timeout=LONGEST_S)
    wait_cluster_stable(members, timeout=LONGEST_S)


def _write(member: InstanceProcess) -> dict[str, Any]:
    expected = {}
    for n in range(KEYS):
        key = f"failover-{n}"
        status, body = http(
            "POST", f"{member.url}/commands/product/{key}/receive_shipment", {"quantity": n + 1}
        )
        assert status == 200, body
        expected[key] = {"on_hand": n + 1}
    return expected


def _failover(members: list[InstanceProcess], expected: dict[str, Any]) -> dict[str, Any]:
    """One kill -9 under the load; what the load saw (see the module)."""
    _ready(members)
    _wait_answered(members, expected, f"?max_lag={MAX_LAG}")
    store = Store.of(members[0], "stock")
    _, owners = http("GET", f"{members[0].url}/stores/stock/owners/{next(iter(expected))}")
    victim = next(m for m in members if m.url == owners["active"])
    _, before = http("GET", f"{members[0].url}/cluster")
    owned = [
        int(p) for p, e in before["partitions"][store.topic].items() if e["active"] == victim.url
    ]
    load = QueryLoad(members, store, expected, max_lag=MAX_LAG)
    try:
        _until(lambda: min(load.rounds.values()) >= 2, "two rounds of the load")
        load.mark_dead(victim.url)
        killed_at = time.monotonic()
        victim.kill()
        load.dead_since = time.monotonic()
        survivors = [m for m in members if m is not victim]
        _wait_answered(survivors, expected, "")
        answered_s = time.monotonic() - killed_at
    finally:
        load.stop()
    lagged = [
        min(
            (at for at in load.lagged_answered.get((s.url, p), []) if at >= load.dead_since),
            default=float("inf"),
        )
        - killed_at
        for s in survivors
        for p in owned
    ]
    return {
        "to_dead": len(load.to_dead),
        "in_flight": load.in_flight_to_dead,
        "reaped_s": load.dead_since - killed_at,
        "standby_read_s": max(lagged),
        "answered_s": answered_s,
        "statuses": dict(load.statuses),
        "lagged": dict(load.lagged),
        "wrong": load.wrong[:5],
    }


def _wait_answered(members: list[InstanceProcess], expected: dict[str, Any], query: str) -> None:
    def answered() -> bool:
        for member in members:
            for key, value in expected.items():
                try:
                    status, body = http("GET", f"{member.url}/stores/stock/keys/{key}{query}")
                except OSError:
                    return False
                if status != 200 or body["value"] != value:
                    return False
        return True

    _until(answered, f"every key answered{query}")


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + LONGEST_S
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {LONGEST_S}s"
        time.sleep(0.05)


def _figures(results: list[dict[str, Any]]) -> list[Figure]:
    runs = f"{len(results)} runs of kill -9 of 1 of 3 instances under load"
    details = {"runs": results}
    return [
        Figure(
            "failover: redirects into the dead member, reads sent after it died",
            sum(r["to_dead"] for r in results),
            "redirects",
            target=("<=", 0),
            absolute=True,
            note=f"{runs}; in flight at the kill (sent before it was reaped, "
            f"{statistics.median(r['reaped_s'] for r in results):.2f} s median after the "
            f"SIGKILL): {[r['in_flight'] for r in results]}",
            details=details,
        ),
        Figure(
            "failover: reads with max_lag answered again (all survivors, all its partitions)",
            statistics.median(r["standby_read_s"] for r in results),
            "s",
            STANDBY_READ_TARGET_S,
            "the later issue's target",
            ("<=", 1.0),
            note=f"median of {runs}: {[round(r['standby_read_s'], 3) for r in results]}",
        ),
        Figure(
            "failover: every key answered again without max_lag",
            statistics.median(r["answered_s"] for r in results),
            "s",
            note=f"info, median of {runs}: {[round(r['answered_s'], 2) for r in results]}; "
            f"statuses {[r['statuses'] for r in results]}",
        ),
    ]
