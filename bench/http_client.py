"""A lean keep-alive HTTP/1.1 client for the load generators that share the 2 cores with the
servers they measure.

It speaks just what the figures need (the instances always answer with a ``content-length``):
aiohttp used 518–549 µs of client CPU per command at 1k commands/s, this one 178–248 µs (and
the instance then sustained 645–725 commands/s instead of 442–518).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import urllib.parse

REDIRECTS = (301, 302, 303, 307, 308)


class Connection:
    """One keep-alive connection to ``host``:``port``, opened on first use."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, bytes, str | None]:
        """Status, body and ``location`` header (None if absent) of one request."""
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._streams
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        try:
            writer.write(head.encode() + b"\r\n" + (body or b""))
            status = int((await reader.readline()).split()[1])
            length, location = 0, None
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"location":
                    location = value.strip().decode("latin-1")
            return status, await reader.readexactly(length), location
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
            self.close()
            raise ConnectionError(f"{method} {path} failed") from None

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class Connections:
    """One keep-alive :class:`Connection` per host, following redirects as a browser would."""

    def __init__(self) -> None:
        self._by_host: dict[str, Connection] = {}

    async def get(self, url: str, max_redirects: int = 3) -> tuple[int, bytes]:
        """Status and body of ``GET url`` after following up to ``max_redirects`` redirects
        (0: a redirect is answered as it is)."""
        redirects = 0
        while True:
            parts = urllib.parse.urlsplit(url)
            connection = self._by_host.get(parts.netloc)
            if connection is None:
                connection = Connection(parts.hostname or "127.0.0.1", parts.port or 80)
                self._by_host[parts.netloc] = connection
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            status, body, location = await connection.request("GET", path)
            if status not in REDIRECTS or location is None or redirects == max_redirects:
                return status, body
            url = urllib.parse.urljoin(url, location)
            redirects += 1

    def close(self) -> None:
        for connection in self._by_host.values():
            connection.close()
        self._by_host.clear()


def get_repeatedly(
    urls: list[str], *, seconds: float, connections: int = 32, rate: float | None = None
) -> int:
    """GET every one of ``urls`` (following redirects) from ``connections`` concurrent
    clients, over and over until ``seconds`` passed, in a separate (spawned) process; the
    number of GETs. Each must end in a 200 (AssertionError otherwise). With ``rate``, the GETs
    leave on a schedule of ``rate`` per second, as long as a client is free to send the next
    one; without, each client sends its next GET as soon as its last one is answered."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_get_repeatedly, (urls, seconds, connections, rate))


def _get_repeatedly(urls: list[str], seconds: float, connections: int, rate: float | None) -> int:
    done = 0
    started = time.perf_counter()

    async def client(deadline: float) -> None:
        nonlocal done
        open_connections = Connections()  # kept alive for the whole run, as a client pool
        try:
            while time.perf_counter() < deadline:
                slot = done
                done += 1
                if rate is not None:
                    delay = started + slot / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                url = urls[slot % len(urls)]
                status, body = await open_connections.get(url)
                if status != 200:
                    raise AssertionError(f"{url}: {status} {body[:200]!r}")
        finally:
            open_connections.close()

    async def run() -> None:
        deadline = started + seconds
        await asyncio.gather(*(client(deadline) for _ in range(connections)))

    asyncio.run(run())
    return done
