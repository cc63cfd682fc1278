"""The nemesis: faults injected one after another into a :class:`Deployment`, chosen by a
seeded random generator, each held for a while and repaired, the cluster let settle before the
next. Every injection and repair is recorded (:class:`~tests.nemesis.history.Fault`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from foldstream.errors import FoldstreamError
from tests.nemesis.deployment import Deployment, cut_instance_from_brokers
from tests.nemesis.history import Clock, Fault

#: Every kind of fault; those marked need hosts of their own (a Network).
KINDS = (
    "kill-instance",
    "pause-instance",
    "kill-broker",
    "partition-broker",
    "partition-instance-from-brokers",
    "partition-instances",
)
NEEDS_NETWORK = frozenset(
    {"partition-broker", "partition-instance-from-brokers", "partition-instances"}
)
SETTLE_S = 240.0


@dataclass
class Nemesis:
    deployment: Deployment
    clock: Clock
    seed: int
    faults: list[Fault] = field(default_factory=list)

    def run(self, duration: float, kinds: Sequence[str] = KINDS) -> None:
        """Inject faults of ``kinds`` until ``duration`` seconds have passed."""
        rng = random.Random(self.seed)
        usable = [k for k in kinds if self.deployment.network is not None or k not in NEEDS_NETWORK]
        deadline = self.clock.now() + duration
        while self.clock.now() < deadline:
            self.inject(rng.choice(usable), rng)
            self.settle()

    def run_each(self, kinds: Sequence[str] = KINDS) -> None:
        """Inject one fault of each of ``kinds``, in order (those a Network is missing for are
        left out), the cluster let settle after each."""
        rng = random.Random(self.seed)
        for kind in kinds:
            if self.deployment.network is not None or kind not in NEEDS_NETWORK:
                self.inject(kind, rng)
                self.settle()

    def inject(self, kind: str, rng: random.Random) -> None:
        """Inject one fault of ``kind``, hold it, repair it."""
        session_s = self.deployment.session_timeout_ms / 1000
        hold = rng.uniform(1.0, 3.0) * session_s
        steps: dict[str, Callable[[random.Random, float], None]] = {
            "kill-instance": self._kill_instance,
            "pause-instance": self._pause_instance,
            "kill-broker": self._kill_broker,
            "partition-broker": self._partition_broker,
            "partition-instance-from-brokers": self._partition_instance,
            "partition-instances": self._partition_instances,
        }
        steps[kind](rng, hold)

    def _note(self, action: str, target: str, detail: str = "") -> None:
        self.faults.append(Fault(self.clock.now(), action, target, detail))

    def _hold(self, seconds: float) -> None:
        time.sleep(seconds)

    def _kill_instance(self, rng: random.Random, hold: float) -> None:
        n = rng.randrange(self.deployment.size)
        self._note("kill", f"instance {n}")
        self.deployment.kill_instance(n)
        self._hold(hold)
        self._note("restart", f"instance {n}")
        self.deployment.restart_instance(n)
        self._note("ready", f"instance {n}")

    def _pause_instance(self, rng: random.Random, hold: float) -> None:
        n = rng.randrange(self.deployment.size)
        past = max(hold, 1.5 * self.deployment.session_timeout_ms / 1000)
        self._note("pause", f"instance {n}")
        self.deployment.pause_instance(n)
        self._hold(past)
        self._note("resume", f"instance {n}")
        self.deployment.resume_instance(n)

    def _kill_broker(self, rng: random.Random, hold: float) -> None:
        node = rng.randrange(self.deployment.brokers) + 1
        self._note("kill", f"broker {node}")
        self.deployment.kill_broker(node)
        self._hold(hold)
        self._note("restart", f"broker {node}")
        self.deployment.restart_broker(node)
        self._note("ready", f"broker {node}")

    def _partition_broker(self, rng: random.Random, hold: float) -> None:
        deployment = self.deployment
        node = rng.randrange(deployment.brokers)
        host = deployment.broker_hosts[node]
        others = [h for h in [*deployment.broker_hosts, *deployment.instance_hosts] if h != host]
        self._note("partition", f"broker {node + 1}", "from every other host")
        for other in others:
            deployment.cut(host, other)
        self._hold(hold)
        for other in others:
            deployment.heal(host, other)
        self._note("heal", f"broker {node + 1}")

    def _partition_instance(self, rng: random.Random, hold: float) -> None:
        n = rng.randrange(self.deployment.size)
        self._note("partition", f"instance {n}", "from the brokers")
        heal = cut_instance_from_brokers(self.deployment, n)
        self._hold(hold)
        heal()
        self._note("heal", f"instance {n}")

    def _partition_instances(self, rng: random.Random, hold: float) -> None:
        a, b = rng.sample(range(self.deployment.size), 2)
        hosts = self.deployment.instance_hosts
        self._note("partition", f"instances {a} and {b}")
        self.deployment.cut(hosts[a], hosts[b])
        self._hold(hold)
        self.deployment.heal(hosts[a], hosts[b])
        self._note("heal", f"instances {a} and {b}")

    def settle(self) -> None:
        """Wait until every instance sees the same members, with every partition owned and a
        caught-up standby; record it as a fault (the cluster did not recover) if it never does."""
        try:
            self.deployment.wait_stable(timeout=SETTLE_S)
        except FoldstreamError as exc:
            self._note("unsettled", "cluster", str(exc)[:500])
            raise
        self._note("settled", "cluster")
