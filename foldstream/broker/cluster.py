"""A cluster of Apache Kafka nodes on this machine, each a process of its own, every node both
broker and controller (a quorum of all of them), for development, tests and benchmarks.

Nothing else in foldstream knows about it: every component only sees a bootstrap address, so
any other Kafka cluster is used by pointing ``KAFKA_BOOTSTRAP_SERVERS`` at it.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka.admin import AdminClient
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from foldstream.broker.jars import KAFKA_VERSION, kafka_libs
from foldstream.broker.node import DEFAULT_HEAP, KafkaNode, NodeSpec, node_properties
from foldstream.broker.ports import free_port
from foldstream.errors import BrokerUnavailable, ConfigurationError
from foldstream.java import find_java

LAYOUT_FILE = "cluster.json"
STOP_TIMEOUT = 30.0  # a clean shutdown; a node still running after it is killed


class KafkaCluster:
    """``brokers`` Apache Kafka nodes on ``host``, started by :meth:`start` (or ``with``).

    ``port`` is the first client port: nodes listen on ``port``, ``port + 1``, … and their
    controllers on the ``brokers`` ports after those; without it, each port is a free one.
    ``data_dir`` keeps the cluster's logs across restarts (``node-<id>/`` each, and the cluster's
    id in ``cluster.json``); without it they live in a temporary directory removed by
    :meth:`stop`. ``properties`` are added to (or replace) every node's ``server.properties``;
    ``client_protocol`` is the security protocol of the client listener (also the brokers'
    own), ``format_args`` extra arguments of the storage tool's ``format`` (``--add-scram``),
    ``client_config`` what a client needs to reach it (checking that it answers).
    ``hosts`` and ``launchers`` (one each per node) put each node on an address of its own,
    its Java command run under its launcher (``ip netns exec NAME``: a network namespace).
    """

    def __init__(
        self,
        *,
        brokers: int = 1,
        port: int | None = None,
        data_dir: Path | None = None,
        heap: str = DEFAULT_HEAP,
        host: str = "127.0.0.1",
        client_protocol: str = "PLAINTEXT",
        properties: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
        client_config: Mapping[str, Any] | None = None,
        advertised: Sequence[str] | None = None,
        hosts: Sequence[str] | None = None,
        launchers: Sequence[Sequence[str]] | None = None,
        log_level: str = "INFO",
        version: str = KAFKA_VERSION,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        if brokers < 1:
            raise ConfigurationError(f"--brokers {brokers}: a cluster has at least one node")
        self.keeps_data = data_dir is not None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="foldstream-kafka-"))
        self.version = version
        self.format_args = list(format_args)
        self.client_config = dict(client_config or {})
        self.progress = progress
        clients, controllers = _ports(brokers, port)
        specs = [
            NodeSpec(
                node_id=n + 1,
                client_port=clients[n],
                controller_port=controllers[n],
                directory=self.data_dir / f"node-{n + 1}",
                host=hosts[n] if hosts else host,
                advertised=advertised[n] if advertised else None,
                launcher=list(launchers[n]) if launchers else [],
                client_protocol=client_protocol,
                properties=dict(properties or {}),
            )
            for n in range(brokers)
        ]
        self._settings = {"heap": heap, "log_level": log_level}
        self._specs = specs
        self.nodes: list[KafkaNode] = []

    @property
    def bootstrap(self) -> str:
        """The address clients are given: every node's client listener."""
        return ",".join(spec.client_address for spec in self._specs)

    @property
    def port(self) -> int:
        return self._specs[0].client_port

    @property
    def pid(self) -> int | None:
        """The first node's process id while it runs."""
        return self.nodes[0].pid if self.nodes else None

    @property
    def pids(self) -> list[int]:
        """Every running node's process id (for measuring the brokers' CPU and memory)."""
        return [node.pid for node in self.nodes if node.running and node.pid is not None]

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Fetch Kafka's jars if needed, format new nodes' storage, start every node and wait
        until each answers; raises :class:`BrokerUnavailable` naming the node that did not."""
        libs = kafka_libs(self.version, progress=self.progress)
        java, _ = find_java("the Kafka broker")
        self._check_ports_free()
        cluster_id = self._cluster_id()
        voters = [spec.voter for spec in self._specs]
        self.nodes = [
            KafkaNode(spec, libs=libs, java=java, **self._settings) for spec in self._specs
        ]
        for node in self.nodes:
            node.configure(node_properties(node.spec, voters, len(self.nodes)))
        self._format([node for node in self.nodes if not node.formatted], cluster_id)
        for node in self.nodes:
            node.start()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _check_ports_free(self) -> None:
        for spec in self._specs:
            if spec.launcher:
                continue  # its ports are another network namespace's
            for port in (spec.client_port, spec.controller_port):
                with socket.socket() as sock:
                    # As Kafka binds: a port left in TIME_WAIT by a node stopped before is free.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        sock.bind(("127.0.0.1", port))
                    except OSError as exc:
                        raise ConfigurationError(
                            f"port {port} (node {spec.node_id}) is in use: stop what listens "
                            "there or choose another --port"
                        ) from exc

    def _cluster_id(self) -> str:
        """The id stored in the data directory, or a new one stored there: a rerun on kept
        data keeps its cluster (and may not change its number of nodes)."""
        layout_path = self.data_dir / LAYOUT_FILE
        if layout_path.exists():
            layout = json.loads(layout_path.read_text())
            if layout["brokers"] != len(self._specs):
                raise ConfigurationError(
                    f"{self.data_dir} holds a cluster of {layout['brokers']} node(s), not "
                    f"{len(self._specs)}: use --brokers {layout['brokers']}, or another --data-dir"
                )
            return str(layout["cluster_id"])
        cluster_id = _random_cluster_id()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        layout_path.write_text(json.dumps({"cluster_id": cluster_id, "brokers": len(self._specs)}))
        return cluster_id

    def _format(self, nodes: list[KafkaNode], cluster_id: str) -> None:
        running = [
            (
                node,
                subprocess.Popen(
                    node.format_command(cluster_id, self.format_args),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                ),
            )
            for node in nodes
        ]
        for node, process in running:
            output, _ = process.communicate()
            if process.returncode != 0:
                last = output.strip().splitlines()[-1:] or [f"exit {process.returncode}"]
                raise BrokerUnavailable(
                    f"formatting Kafka node {node.spec.node_id}'s storage in "
                    f"{node.spec.directory} failed: {last[0]}"
                )

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until every node listens and the cluster's metadata names all of them."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            self._await(node, deadline)
        admin = AdminClient({**self.client_config, "bootstrap.servers": self.bootstrap})
        try:
            for attempt in Retrying(
                stop=stop_after_delay(max(0.0, deadline - time.monotonic())),
                wait=wait_fixed(0.2),
                retry=retry_if_exception_type(Exception),
                reraise=True,
            ):
                with attempt:
                    self.check_running()
                    brokers = admin.list_topics(timeout=2.0).brokers
                    if len(brokers) < len(self.nodes):
                        raise BrokerUnavailable(
                            f"{len(brokers)} of {len(self.nodes)} Kafka nodes registered"
                        )
        except BrokerUnavailable:
            raise
        except Exception as exc:
            raise BrokerUnavailable(
                f"Kafka at {self.bootstrap} did not answer within {timeout:.0f}s: {exc}"
            ) from exc

    def _await(self, node: KafkaNode, deadline: float) -> None:
        while True:
            self.check_running()
            with socket.socket() as sock:
                sock.settimeout(1.0)
                if sock.connect_ex((node.spec.host, node.spec.client_port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"Kafka node {node.spec.node_id} does not listen on port "
                    f"{node.spec.client_port}: see {node.log}"
                )
            time.sleep(0.1)

    def check_running(self) -> None:
        """Raise :class:`BrokerUnavailable` for a node that ended by itself."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is not None:
                raise node.failure()

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def restart_node(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped or killed node again and wait until the cluster names it."""
        self.node(node_id).start()
        self.wait_ready(timeout)

    def stop(self) -> None:
        """Stop every node cleanly (killing any still running after :data:`STOP_TIMEOUT`);
        remove the data of a cluster that keeps none."""
        for node in self.nodes:
            node.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        for node in self.nodes:
            if not node.wait(max(0.1, deadline - time.monotonic())):
                node.kill()
        if not self.keeps_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _ports(brokers: int, first: int | None) -> tuple[list[int], list[int]]:
    if first is None:
        ports: list[int] = []
        while len(ports) < 2 * brokers:
            port = free_port()
            if port not in ports:
                ports.append(port)
        return ports[:brokers], ports[brokers:]
    if not 0 < first <= 65535 - 2 * brokers:
        raise ConfigurationError(f"--port {first}: a TCP port, with {2 * brokers} free after it")
    return (
        [first + n for n in range(brokers)],
        [first + brokers + n for n in range(brokers)],
    )


def _random_cluster_id() -> str:
    """A cluster id as Kafka's ``StorageTool random-uuid`` makes one (16 random bytes in
    URL-safe base64), without starting a JVM for it."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # the storage tool would read it as an option
            return text
