"""Free loopback ports for the processes foldstream starts (brokers, instances, Spark)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


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
