"""The peer watch against a real uvicorn server in a process of its own: a member whose process
is killed is gone the moment it is reaped (asked synchronously, as a redirect asks), one that
stands still is not, and one that comes back on its port is watched again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from foldstream.broker import free_port
from foldstream.cluster.peers import Peer, PeerWatch
from foldstream.testing.scenario import wait_until

SERVER = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"alive"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _serve(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SERVER, str(port)])


@pytest.fixture
def watched() -> Iterator[tuple[PeerWatch, str, list[int]]]:
    """A watch of one member's URL, and how often it told its listener of a change."""
    url = f"http://127.0.0.1:{free_port()}"
    told = [0]

    def changed() -> None:
        told[0] += 1

    watch = PeerWatch(own_url="http://127.0.0.1:1", urls=lambda: [url], on_change=changed)
    watch.start()
    yield watch, url, told
    watch.stop()


def _connected(watch: PeerWatch, url: str) -> bool:
    peer = watch._peers.get(url)  # noqa: SLF001 - whether the connection is open yet
    return peer is not None and peer.sock is not None and not watch.gone(url)


def test_a_killed_member_is_gone_as_soon_as_it_is_reaped(
    watched: tuple[PeerWatch, str, list[int]],
) -> None:
    watch, url, told = watched
    server = _serve(int(url.rpartition(":")[2]))
    try:
        wait_until(lambda: _connected(watch, url), lambda: "never connected", 30)
        time.sleep(2.5)  # pings answered meanwhile keep it alive
        assert not watch.gone(url)
        told_before = told[0]
        server.kill()
        server.wait()
        assert watch.gone(url)  # at once: no wait for the watching thread
        wait_until(lambda: told[0] > told_before, lambda: "the listener was not told", 5)
        assert watch.gone_urls() == {url} and watch.losses == 1
    finally:
        server.kill()
        server.wait()
    server = _serve(int(url.rpartition(":")[2]))  # back on its port: watched again
    try:
        wait_until(lambda: _connected(watch, url), lambda: "never connected again", 30)
        assert watch.gone_urls() == frozenset()
    finally:
        server.kill()
        server.wait()


def test_the_kernel_says_at_once_that_the_other_end_closed() -> None:
    """What a redirect asks: nothing read or written on the connection since, no thread of
    the watch running, the closed end is seen by the first question after the kill."""
    port = free_port()
    server = _serve(port)
    peer = Peer(f"http://127.0.0.1:{port}")
    try:
        wait_until(
            lambda: peer.connect(time.monotonic()) or peer.sock is not None,
            lambda: "never connected",
            30,
        )
        assert not peer.gone()
        server.kill()
        server.wait()
        assert peer.gone()
    finally:
        server.kill()
        server.wait()
        peer.close()


def test_a_member_that_stands_still_is_not_gone(
    watched: tuple[PeerWatch, str, list[int]],
) -> None:
    """Its kernel keeps its connections open: heartbeats find a pause, not this watch."""
    watch, url, _ = watched
    server = _serve(int(url.rpartition(":")[2]))
    try:
        wait_until(lambda: _connected(watch, url), lambda: "never connected", 30)
        os.kill(server.pid, signal.SIGSTOP)
        time.sleep(3)  # pings go unanswered meanwhile
        assert not watch.gone(url)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()


def test_a_port_nothing_listens_on_is_gone(watched: tuple[PeerWatch, str, list[int]]) -> None:
    """A member starting (its HTTP server listens last) or stopped: nothing is sent there."""
    watch, url, _ = watched
    wait_until(lambda: watch.gone(url), lambda: "a refused connection said nothing", 10)
    assert watch.losses == 0  # it never answered: no loss, only not there yet
