"""Whether another member's process is still there, known the moment it is gone: from a
connection this member keeps open to the other's HTTP port.

Heartbeats say a member is late only after a while (:mod:`.suspects`); a ``kill -9`` closes the
dead process's sockets at once, and the kernel tells the other end. So each member keeps one
HTTP/1.1 connection to every other member's URL, asking ``GET /health`` on it every second (an
idle connection may be closed by the server), and a redirect first asks, with one ``poll`` and
no wait, whether the target's end was closed: a member whose connection was closed, or whose
port refuses a new one, is *gone* (a suspect) until a new connection to it opens. A paused
member's kernel keeps its connections open: the heartbeats find that one.

Only ``http`` URLs are watched: behind an ``https`` URL is usually a proxy terminating TLS,
whose port stays open when the instance behind it dies (heartbeats alone say so then). Only
what the other end does counts: a connection that cannot be opened for any other reason (a
timeout, no route) says nothing, and neither does anything read on it (the answers are
drained, never parsed).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import quote, urlsplit

log = logging.getLogger(__name__)

#: How often a connection is asked ``GET /health``: below any server's idle timeout (uvicorn
#: closes a kept-alive connection idle for 5 s).
PING_EVERY_S = 1.0
#: How long opening a connection may take, and how soon one refused or lost is tried again.
CONNECT_TIMEOUT_S = 0.5
RECONNECT_EVERY_S = 0.25
#: How long the watching thread waits for an event before its next round of pings.
WAIT_S = 0.2
#: What a closed other end raises on the connection (Linux: POLLRDHUP for a FIN).
HANG_UP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


class Peer:
    """The connection to one other member's HTTP port."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self.address = (parts.hostname or "", parts.port or 80)
        path = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~").encode()
        host = parts.netloc.encode("ascii", "replace")
        self.ping = b"GET %s/health HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, host)
        self.lock = threading.Lock()  # the socket is not closed while it is polled
        self.sock: socket.socket | None = None
        self._hang_up: select.poll | None = None
        self.refused = False  # the last connection was refused or closed by the other end
        self.answered = False  # a connection was open once: refusing one since is a loss
        self.next_ping = 0.0
        self.next_connect = 0.0

    def gone(self) -> bool:
        """Whether the other end closed this member's connection (or refuses a new one): the
        process is gone, or its HTTP server stopped. Asks the kernel, without waiting."""
        with self.lock:
            if self.refused:
                return True
            return self._hang_up is not None and bool(self._hang_up.poll(0))

    def connect(self, now: float) -> None:
        """Open the connection (in the watching thread); ``refused`` says how it went."""
        self.next_connect = now + RECONNECT_EVERY_S
        try:
            sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_S)
        except ConnectionRefusedError:
            self.refused = True
            return
        except OSError as exc:  # a timeout, no route: says nothing of the other end
            log.debug("no connection to %s: %s", self.url, exc)
            return
        sock.setblocking(False)
        hang_up = select.poll()
        hang_up.register(sock, HANG_UP)
        with self.lock:
            self.sock, self._hang_up, self.refused = sock, hang_up, False
        self.answered = True
        self.next_ping = now

    def send_ping(self, now: float) -> None:
        assert self.sock is not None
        self.next_ping = now + PING_EVERY_S
        try:
            self.sock.send(self.ping)
        except OSError:
            self.close(closed_by_peer=True)

    def drain(self) -> None:
        """Read what came (answers to the pings; never parsed); a closed end closes it here."""
        assert self.sock is not None
        try:
            while self.sock.recv(65536):
                pass
        except BlockingIOError:
            return  # everything read
        except OSError:
            pass  # reset by the other end
        self.close(closed_by_peer=True)

    def close(self, *, closed_by_peer: bool = False) -> None:
        with self.lock:
            sock, self.sock, self._hang_up = self.sock, None, None
            self.refused = self.refused or closed_by_peer
        if sock is not None:
            sock.close()


class PeerWatch:
    """Connections to the members ``urls()`` returns (this member's own URL left out), kept by
    a thread of its own; ``on_change()`` is called when a member turns gone or comes back."""

    def __init__(
        self, *, own_url: str, urls: Callable[[], Iterable[str]], on_change: Callable[[], None]
    ) -> None:
        self.own_url = own_url
        self._urls = urls
        self._on_change = on_change
        self._peers: dict[str, Peer] = {}  # replaced whole: read by the request threads
        self._told: frozenset[str] = frozenset()
        self.losses = 0  # members found gone, ever (a metric)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for peer in self._peers.values():
            peer.close()

    def gone(self, url: str) -> bool:
        """Whether the member at ``url`` closed or refuses its connection (see the module)."""
        peer = self._peers.get(url)
        return peer is not None and peer.gone()

    def gone_urls(self) -> frozenset[str]:
        return frozenset(url for url, peer in self._peers.items() if peer.gone())

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._round()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("watching the other members' connections failed")
                self._stopping.wait(WAIT_S)

    def _round(self) -> None:
        self._follow_members()
        now = time.monotonic()
        readable = select.poll()
        by_fd: dict[int, Peer] = {}
        for peer in self._peers.values():
            if peer.sock is None and now >= peer.next_connect:
                peer.connect(now)
            if peer.sock is not None and now >= peer.next_ping:
                peer.send_ping(now)
            if peer.sock is not None:
                by_fd[peer.sock.fileno()] = peer
                readable.register(peer.sock, select.POLLIN | HANG_UP)
        self._tell()
        for fd, _ in readable.poll(WAIT_S * 1000 if by_fd else 0):
            by_fd[fd].drain()
        if not by_fd:
            self._stopping.wait(WAIT_S)
        self._tell()

    def _follow_members(self) -> None:
        """Watch every member now listed, and no other."""
        urls = {url for url in self._urls() if url != self.own_url and _watched(url)}
        if urls == self._peers.keys():
            return
        for url in self._peers.keys() - urls:
            self._peers[url].close()
        self._peers = {url: self._peers.get(url) or Peer(url) for url in urls}

    def _tell(self) -> None:
        gone = self.gone_urls()
        if gone == self._told:
            return
        for url in sorted(gone - self._told):
            if not self._peers[url].answered:  # starting: its HTTP server listens last
                log.info("the member at %s takes no connection yet: nothing is sent to it", url)
                continue
            self.losses += 1
            log.warning(
                "the member at %s closed its connection or refuses one: its process is gone "
                "(or its HTTP server stopped); no client is sent to it until it answers again",
                url,
            )
        for url in sorted((self._told - gone) & self._peers.keys()):  # not those that left
            log.info("the member at %s answers connections again", url)
        self._told = gone
        try:
            self._on_change()
        except Exception:  # noqa: BLE001 - the watch goes on whatever the listener does
            log.exception("reacting to a member gone or back failed")


def _watched(url: str) -> bool:
    """Whether ``url`` is one whose connections say whether its member is there (see the
    module: not ``https``)."""
    return urlsplit(url).scheme == "http"
