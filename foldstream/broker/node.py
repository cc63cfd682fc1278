"""One Apache Kafka node in KRaft's combined mode (broker and controller in one JVM): its
configuration files, its formatted storage, and its process.

A node's directory holds ``server.properties`` and ``log4j2.properties`` (written at each
start), ``data/`` (the log, formatted once: kept across restarts) and ``server.log`` (rolled at
10 MB, two kept).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from foldstream.errors import BrokerUnavailable

# A test or development node needs far less than the 1 GB of Kafka's own scripts.
DEFAULT_HEAP = "384m"
# Kafka's own scripts' collector settings (kafka-run-class.sh).
_JVM_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
_LOG4J2 = """status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 10MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.statechange.name = state.change.logger
logger.statechange.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
"""


@dataclass(frozen=True)
class NodeSpec:
    """Where one node listens and keeps its files, and what it is told of the others."""

    node_id: int
    client_port: int
    controller_port: int
    directory: Path
    host: str = "127.0.0.1"
    advertised: str | None = None  # host:port clients are told to use, if not the listener's
    client_protocol: str = "PLAINTEXT"
    properties: Mapping[str, str] = field(default_factory=dict)
    # What the node's Java command runs under (e.g. ``ip netns exec NAME``: a host of its own).
    launcher: Sequence[str] = ()

    @property
    def client_address(self) -> str:
        return self.advertised or f"{self.host}:{self.client_port}"

    @property
    def voter(self) -> str:
        return f"{self.node_id}@{self.host}:{self.controller_port}"


def node_properties(spec: NodeSpec, voters: Sequence[str], nodes: int) -> dict[str, str]:
    """``server.properties`` of a combined broker and controller among ``nodes`` nodes whose
    controllers are ``voters``; ``spec.properties`` override these."""
    replicas = str(min(nodes, 3))
    in_sync = str(min(nodes, 2))
    properties = {
        "process.roles": "broker,controller",
        "node.id": str(spec.node_id),
        "controller.quorum.voters": ",".join(voters),
        "listeners": (
            f"CLIENT://{spec.host}:{spec.client_port},CONTROLLER://{spec.host}:{spec.controller_port}"
        ),
        "advertised.listeners": f"CLIENT://{spec.client_address}",
        "listener.security.protocol.map": f"CLIENT:{spec.client_protocol},CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "CLIENT",
        "log.dirs": str(spec.directory / "data"),
        # Topics are foldstream's to create, with the partitions and settings it checks.
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
        "group.initial.rebalance.delay.ms": "0",
        # The cleaner's buffer lives in the heap: Kafka's 128 MB default is a third of it.
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
    }
    properties.update(spec.properties)
    return properties


def write_properties(path: Path, properties: Mapping[str, str]) -> None:
    lines = [f"{key}={_escaped(value)}" for key, value in properties.items()]
    path.write_text("\n".join(lines) + "\n")


def _escaped(value: str) -> str:
    # Java's .properties reads a backslash as an escape: JAAS settings and paths keep theirs.
    return value.replace("\\", "\\\\").replace("\n", "\\n")


class KafkaNode:
    """One node's process: started, stopped, killed and paused by the test or CLI that owns it.

    Started from the main thread, the node is killed by the kernel when this process ends, even
    by ``kill -9`` (util-linux's ``setpriv --pdeathsig``), so no broker outlives its owner."""

    def __init__(
        self, spec: NodeSpec, *, libs: Path, java: str, heap: str = DEFAULT_HEAP, log_level: str
    ) -> None:
        self.spec = spec
        self.libs = libs
        self.java = java
        self.heap = heap
        self.log_level = log_level
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log(self) -> Path:
        return self.spec.directory / "server.log"

    @property
    def formatted(self) -> bool:
        return (self.spec.directory / "data" / "meta.properties").exists()

    def configure(self, properties: Mapping[str, str]) -> None:
        self.spec.directory.mkdir(parents=True, exist_ok=True)
        write_properties(self.spec.directory / "server.properties", properties)
        (self.spec.directory / "log4j2.properties").write_text(
            _LOG4J2.replace("{level}", self.log_level)
        )

    def format_command(self, cluster_id: str, format_args: Sequence[str]) -> list[str]:
        """The storage tool's command that formats this node's log directory for
        ``cluster_id`` (run once, before the node's first start)."""
        return [
            *self._java("128m"),
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.spec.directory / "server.properties"),
            *format_args,
        ]

    def start(self) -> None:
        if self.running:
            return
        command = [
            *self.spec.launcher,
            *self._java(self.heap),
            "kafka.Kafka",
            str(self.spec.directory / "server.properties"),
        ]
        setpriv = shutil.which("setpriv")
        # The parent-death signal follows the thread that started the child: only the main
        # thread lives as long as the process.
        if setpriv and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        with (self.spec.directory / "stdout.log").open("ab") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C reaches the owner, which stops it
            )

    def _java(self, heap: str) -> list[str]:
        return [
            self.java,
            f"-Xmx{heap}",
            *_JVM_FLAGS,
            f"-Dkafka.logs.dir={self.spec.directory}",
            f"-Dlog4j2.configurationFile={self.spec.directory / 'log4j2.properties'}",
            "-cp",
            f"{self.libs}/*",
        ]

    def terminate(self) -> None:
        """Ask the node to stop (a clean shutdown); :meth:`wait` for it."""
        if self.running:
            assert self.process is not None
            self.resume()  # a paused JVM would not act on the signal
            self.process.terminate()

    def wait(self, timeout: float) -> bool:
        """Wait for the node to end; whether it did within ``timeout`` seconds."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """``kill -9``: the node ends at once, as in a crash; its log stays for a restart."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        if self.running and self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running and self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def failure(self) -> BrokerUnavailable:
        """What to tell of a node that ended on its own: its exit and the log's last error."""
        code = None if self.process is None else self.process.poll()
        return BrokerUnavailable(
            f"Kafka node {self.spec.node_id} exited with {code}: {last_error(self.spec.directory)}"
        )


def last_error(directory: Path) -> str:
    """The last ERROR line a node logged (or printed), for a one-line failure."""
    for name in ("server.log", "stdout.log"):
        path = directory / name
        if not path.exists():
            continue
        errors = [
            line.strip()
            for line in path.read_text(errors="replace").splitlines()
            if " ERROR " in line or line.startswith(("ERROR", "Exception", "Error"))
        ]
        if errors:
            return errors[-1][:500]
    return f"see {directory / 'server.log'}"
