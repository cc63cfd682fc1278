"""Command takeover after ``kill -9`` of a partition's owner, with the aggregate store against the
command side of before it, in the same run (``python -m bench --only takeover``).

Each side has a broker of its own and two inventory instances (one standby copy of every store
partition, session timeout :data:`SESSION_TIMEOUT_S`); the events topic's partition
:data:`TARGET` holds ``takeover_events`` events over ``takeover_aggregates`` products, written
in bulk, the other partition none. Once the owner of :data:`TARGET` answers commands (its start
replayed the partition) and the cluster is stable (the other member's standby copies caught
up), the owner is killed with ``kill -9``; the figure is the time until the survivor answers a
command for a product of :data:`TARGET` (commands sent again and again, 10 ms apart). The
answer's version is checked: one more than before the kill.

The figure's side is the example as it is: the survivor's warm standby copy of the aggregate
store lacks at most a changelog tail, and it replays only the events past its snapshots. The
reference side runs the same example through :mod:`bench.replay_serve`, whose command side keeps
no snapshots: the survivor replays the partition from offset 0, as every takeover did before
the aggregate store.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from bench.commands import command_answered, version_of
from bench.report import Figure
from bench.run import BenchRun
from bench.workload import inventory_events, produce, sku
from foldstream.broker import KafkaCluster
from foldstream.errors import FoldstreamError
from foldstream.kafka import TopicSpec, ensure_topics, partition_for
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.scrape import scrape

PARTITIONS = 2
TARGET = 0
SESSION_TIMEOUT_S = 3.0
EVENTS_TOPIC = "inventory.events"
SERVICE = "foldstream.examples.inventory:service"
OLD_WAY = "bench.replay_serve:service"
#: How long a start or a takeover may take before the run gives up.
LONGEST_S = 3600.0


@dataclass(frozen=True)
class Takeover:
    """One side: seconds from the kill until the survivor answered, the events its takeover
    replayed (from its ``/metrics``), and the probed product's versions before and after."""

    seconds: float
    replayed: float
    version_before: int
    version_after: int

    @property
    def state_checked(self) -> bool:
        return self.version_after == self.version_before + 1


def products_in_target(count: int) -> list[str]:
    """The first ``count`` SKUs whose events land in :data:`TARGET`."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        if partition_for(sku(n).encode(), PARTITIONS) == TARGET:
            found.append(sku(n))
        n += 1
    return found


def _active(url: str) -> str:
    """The URL of the member owning :data:`TARGET` of the events topic, as ``url`` sees it."""
    status, view = http("GET", f"{url}/cluster", timeout=5)
    if status != 200:
        raise FoldstreamError(f"{url}/cluster answered {status}: {view}")
    return str(view["partitions"][EVENTS_TOPIC][str(TARGET)]["active"])


def _replayed(url: str) -> float:
    return sum(
        value
        for (name, _), value in scrape(url).items()
        if name == "foldstream_command_replayed_events_total"
    )


def _kill_owner(instances: list[InstanceProcess], product: str) -> Takeover:
    """Kill the owner of :data:`TARGET` once ready; time until the survivor answers."""
    before = version_of(command_answered(instances[0].url, product, time.monotonic() + LONGEST_S))
    wait_cluster_stable(instances, timeout=LONGEST_S)
    owner_url = _active(instances[0].url)
    owner = next(i for i in instances if i.url == owner_url)
    survivor = next(i for i in instances if i is not owner)
    replayed = _replayed(survivor.url)
    killed_at = time.monotonic()
    owner.kill()
    answer = command_answered(survivor.url, product, killed_at + LONGEST_S)
    took = time.monotonic() - killed_at
    return Takeover(took, _replayed(survivor.url) - replayed, before, version_of(answer))


def _side(run: BenchRun, label: str, service: str) -> Takeover:
    """One side of the figure on a broker of its own (see the module)."""
    aggregates, events = run.size["takeover_aggregates"], run.size["takeover_events"]
    products = products_in_target(aggregates)
    with KafkaCluster() as broker:
        ensure_topics(broker.bootstrap, [TopicSpec(EVENTS_TOPIC, PARTITIONS)])
        run.step(
            f"{label}: producing {events:,} events over {aggregates:,} products",
            lambda: produce(
                broker.bootstrap,
                EVENTS_TOPIC,
                inventory_events(aggregates, events, products.__getitem__),
            ),
        )
        instances = [
            InstanceProcess(
                bootstrap=broker.bootstrap,
                state_dir=run.tmp / f"takeover-{label}-{n}",
                service=service,
                partitions=PARTITIONS,
                session_timeout_ms=int(SESSION_TIMEOUT_S * 1000),
                log_path=run.tmp / f"takeover-{label}-{n}.log",
            )
            for n in range(2)
        ]
        try:
            for instance in instances:
                instance.start()
            for instance in instances:
                run.step(
                    f"{label}: instance ready", functools.partial(instance.wait_ready, LONGEST_S)
                )
            return run.step(  # type: ignore[no-any-return]
                f"{label}: kill -9 of the owner → the survivor answers commands",
                lambda: _kill_owner(instances, products[-1]),
            )
        finally:
            for instance in instances:
                instance.stop()


def takeover_figures(run: BenchRun) -> list[Figure]:
    """The takeover from a warm standby copy beside replay from offset 0 (see the module)."""
    warm = _side(run, "aggregate store", SERVICE)
    cold = _side(run, "replay from 0", OLD_WAY)
    size = f"{run.size['takeover_events']:,} events over {run.size['takeover_aggregates']:,}"
    checked = "; ".join(
        f"{name}: version {side.version_before} → {side.version_after}"
        + ("" if side.state_checked else " (NOT one more: state wrong or a command repeated)")
        for name, side in (("warm", warm), ("from 0", cold))
    )
    note = (
        f"{size} products in the partition; events the survivor replayed: "
        f"{warm.replayed:,.0f} (warm) vs {cold.replayed:,.0f} (from 0); {checked}"
    )
    return [
        Figure(
            "command takeover after kill -9, warm standby copy of the aggregate store",
            warm.seconds,
            "s",
            cold.seconds,
            "replay of the partition from offset 0 (no aggregate store), same workload",
            note=f"info: the ratio; {note}",
            details={"warm": vars(warm), "from 0": vars(cold)},
        ),
        Figure(
            "command takeover after kill -9 (warm standby) vs session timeout",
            warm.seconds,
            "s",
            SESSION_TIMEOUT_S,
            "membership session timeout",
            ("<=", 2.0),
            note=f"2 instances, 1 standby; {size} products in the partition",
        ),
    ]
