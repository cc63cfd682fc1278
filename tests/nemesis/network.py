"""Hosts of their own on this machine, and network partitions between them: each host a
network namespace on one bridge, made and removed by the test that uses them.

A process runs on a host under :attr:`Host.launcher` (``ip netns exec NAME``) and listens on
:attr:`Host.ip`; this process (the test, its clients) stays in the machine's own namespace and
reaches every host through the bridge. A partition between two hosts drops what either sends
the other, silently, as a cut cable would: each routes the other's address through a neighbour
that does not exist (a permanent neighbour entry with an address no interface has), so frames
leave and nothing answers. Connections in flight stall, new ones time out; nothing is refused.
No packet filter is needed (this machine's kernel has no iptables or tc actions).

Needs root (``ip netns``, ``ip link``), as the tests that use it run in CI.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

#: The host part of the address nothing answers at, on every host's subnet.
_NOWHERE = 254
_NOWHERE_MAC = "02:00:00:00:00:fe"


def network_namespaces_available() -> str | None:
    """Why hosts cannot be made here (not root, no ``ip``), or None when they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    """A network namespace with one interface on the network's bridge."""

    name: str
    namespace: str
    ip: str
    cut_from: set[str] = field(default_factory=set)

    @property
    def launcher(self) -> list[str]:
        """What to run a command under so that it runs on this host."""
        return ["ip", "netns", "exec", self.namespace]


class Network:
    """A bridge and the hosts on it; :meth:`close` removes them all (also when a test failed).

    Names carry this process's id, so concurrent test runs do not collide; the subnet is
    chosen from it too (``10.X.Y.0/24``, well away from the machine's own networks).
    """

    _serial = itertools.count()

    def __init__(self) -> None:
        serial = next(self._serial)
        pid = os.getpid()
        self.tag = f"fs{pid % 100_000}{serial}"[:9]  # interface names hold 15 characters
        self.subnet = f"10.{200 + (pid + serial) % 50}.{(pid // 50 + serial) % 250}"
        self.bridge = f"{self.tag}br"
        self.gateway = f"{self.subnet}.1"
        self.hosts: dict[str, Host] = {}
        self._up = False

    def start(self) -> Network:
        _ip("link", "add", "name", self.bridge, "type", "bridge")
        self._up = True
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def host(self, name: str) -> Host:
        """A new host named ``name`` (its namespace, address and interface)."""
        number = len(self.hosts) + 10
        host = Host(name, f"{self.tag}-{name}", f"{self.subnet}.{number}")
        veth = f"{self.tag}v{number}"
        _ip("netns", "add", host.namespace)
        self.hosts[name] = host
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        inside = ("-n", host.namespace)
        _ip(*inside, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "link", "set", "lo", "up")
        nowhere = f"{self.subnet}.{_NOWHERE}"
        _ip(
            *inside,
            "neigh",
            "add",
            nowhere,
            "lladdr",
            _NOWHERE_MAC,
            "dev",
            "eth0",
            "nud",
            "permanent",
        )
        return host

    def cut(self, a: Host, b: Host) -> None:
        """Partition ``a`` and ``b``: nothing either sends the other arrives."""
        for one, other in ((a, b), (b, a)):
            if other.name not in one.cut_from:
                _ip("-n", one.namespace, "route", "add", f"{other.ip}/32", "via", self._nowhere)
                one.cut_from.add(other.name)

    def heal(self, a: Host, b: Host) -> None:
        """Undo :meth:`cut` of ``a`` and ``b``."""
        for one, other in ((a, b), (b, a)):
            if other.name in one.cut_from:
                _ip("-n", one.namespace, "route", "del", f"{other.ip}/32")
                one.cut_from.discard(other.name)

    def heal_all(self) -> None:
        for a, b in itertools.permutations(self.hosts.values(), 2):
            self.heal(a, b)

    @property
    def _nowhere(self) -> str:
        return f"{self.subnet}.{_NOWHERE}"

    def close(self) -> None:
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        self.hosts.clear()
        if self._up:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self._up = False

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
