"""A deployment to inject faults into: a replicated Apache Kafka cluster and several instances
of a service, every process on a host of its own when a :class:`Network` is given (so that the
network between any two can be cut), else all on 127.0.0.1.

Topics are created with replication factor 3 and ``min.insync.replicas`` 2 (as many as the
cluster has nodes, up to 3 and 2): one broker node may die without an acknowledged write lost
or writes refused.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess, wait_cluster_stable
from tests.nemesis.network import Host, Network

INVENTORY = "foldstream.examples.inventory:service"


@dataclass
class Deployment:
    """``brokers`` Kafka nodes and ``size`` instances of ``service`` under ``root``."""

    root: Path
    network: Network | None = None
    brokers: int = 3
    size: int = 3
    service: str = INVENTORY
    partitions: int = 6
    session_timeout_ms: int = 3000
    heap: str = "320m"
    instance_args: list[str] = field(default_factory=list)
    kafka: KafkaCluster | None = None
    instances: list[InstanceProcess] = field(default_factory=list)
    broker_hosts: list[Host] = field(default_factory=list)
    instance_hosts: list[Host] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)  # instances stopped with SIGSTOP

    def start(self) -> Deployment:
        self.kafka = self._kafka()
        self.kafka.start()
        self.instances = [self._instance(n) for n in range(self.size)]
        for instance in self.instances:
            instance.start()
        for instance in self.instances:
            instance.wait_ready(timeout=300)
        self.wait_stable()
        return self

    def _kafka(self) -> KafkaCluster:
        if self.network is not None:
            self.broker_hosts = [self.network.host(f"k{n + 1}") for n in range(self.brokers)]
        return KafkaCluster(
            brokers=self.brokers,
            data_dir=self.root / "kafka",
            heap=self.heap,
            hosts=[h.ip for h in self.broker_hosts] or None,
            launchers=[h.launcher for h in self.broker_hosts] or None,
            properties={
                "min.insync.replicas": str(min(self.brokers, 2)),
                # A killed node is fenced, and its partitions led elsewhere, within 4 s
                # (Kafka's default: 9 s), so that a run holds each fault for less.
                "broker.session.timeout.ms": "4000",
                "broker.heartbeat.interval.ms": "500",
            },
        )

    def _instance(self, n: int) -> InstanceProcess:
        assert self.kafka is not None
        placement: dict[str, object] = {}
        env = {}
        if self.network is not None:
            host = self.network.host(f"i{n + 1}")
            self.instance_hosts.append(host)
            placement = {"host": host.ip, "launcher": host.launcher}
            env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the host's name resolves outside its namespace
        return InstanceProcess(
            bootstrap=self.kafka.bootstrap,
            state_dir=self.root / f"instance-{n + 1}",
            service=self.service,
            partitions=self.partitions,
            session_timeout_ms=self.session_timeout_ms,
            env=env,
            args=[
                "--replication-factor",
                str(min(self.brokers, 3)),
                "--min-insync-replicas",
                str(min(self.brokers, 2)),
                *self.instance_args,
            ],
            **placement,  # type: ignore[arg-type]
        )

    @property
    def urls(self) -> list[str]:
        return [i.url for i in self.instances]

    def live(self) -> list[InstanceProcess]:
        """The instances running and not paused."""
        return [
            i
            for n, i in enumerate(self.instances)
            if n not in self.paused and i.process is not None and i.process.poll() is None
        ]

    def wait_stable(self, timeout: float = 180.0) -> None:
        wait_cluster_stable(self.live(), timeout=timeout)

    # -- faults ----------------------------------------------------------------------------

    def kill_instance(self, n: int) -> None:
        self.instances[n].kill()

    def restart_instance(self, n: int) -> None:
        self.instances[n].start()
        self.instances[n].wait_ready(timeout=300)

    def pause_instance(self, n: int) -> None:
        self._signal_group(n, signal.SIGSTOP)
        self.paused.add(n)

    def resume_instance(self, n: int) -> None:
        self._signal_group(n, signal.SIGCONT)
        self.paused.discard(n)

    def _signal_group(self, n: int, sig: signal.Signals) -> None:
        process = self.instances[n].process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, sig)

    def kill_broker(self, node_id: int) -> None:
        assert self.kafka is not None
        self.kafka.node(node_id).kill()

    def restart_broker(self, node_id: int) -> None:
        assert self.kafka is not None
        self.kafka.restart_node(node_id)

    def cut(self, a: Host, b: Host) -> None:
        assert self.network is not None, "partitions need a Network"
        self.network.cut(a, b)

    def heal(self, a: Host, b: Host) -> None:
        assert self.network is not None, "partitions need a Network"
        self.network.heal(a, b)

    def stop(self) -> None:
        for n in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                self.resume_instance(n)
        for instance in self.instances:
            instance.stop(timeout=30)
        if self.kafka is not None:
            self.kafka.stop()


def cut_instance_from_brokers(deployment: Deployment, n: int) -> Callable[[], None]:
    """Partition instance ``n`` from every broker node; returns what heals it."""
    host = deployment.instance_hosts[n]
    for broker in deployment.broker_hosts:
        deployment.cut(host, broker)

    def heal() -> None:
        for broker in deployment.broker_hosts:
            deployment.heal(host, broker)

    return heal
