"""Freshness: command acknowledged → value visible, at a steady command rate.

The projection's figure is measured through the query API by a client process that sends
commands open-loop at ``rate``/s and, for every ``probe_every``-th one, polls the key until its
value reflects the command (``receive_shipment(1)`` only, so ``on_hand == version - 1`` then).
The plain-consumer reference tails the same topic in the bench process, folds with the same
``fold_partition`` into its own stores, and notes when each offset was committed: its freshness
is that time minus the same commands' acknowledgement (``time.monotonic`` is system-wide).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import multiprocessing
import random
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.pool import Pool
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.http_client import Connection
from bench.workload import sku
from foldstream.end_probes import ProbedEnds
from foldstream.examples.inventory import service
from foldstream.kafka import consume_available, consumer_config
from foldstream.projections.chunks import records_of_messages
from foldstream.projections.fold import fold_partition
from foldstream.state import RocksDBWriter, partition_path

IN_FLIGHT = 64
#: A command not answered within this long counts as failed.
ANSWER_TIMEOUT_S = 30.0
#: How long a probe polls for the value to show.
PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Probe:
    partition: int
    offset: int
    acknowledged: float  # time.monotonic()
    visible: float | None  # through the query API; None if never within the timeout


@dataclass
class ClientResult:
    sent: int = 0
    failed: int = 0
    seconds: float = 0.0
    ack_ms: list[float] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    cpu_s: float = 0.0  # the client's own
    #: cores used during the run, by whom (filled in by the bench: instance, broker, client)
    cores: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def client_process() -> Iterator[Pool]:
    """A spawned process for :func:`run_client`, started and its imports done on entry: a
    round measured around ``run_client`` then counts the load alone."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_ready)
        yield pool


def run_client(
    url: str,
    *,
    rate: float,
    seconds: float,
    keys: int,
    probe_every: int = 50,
    process: Pool | None = None,
) -> ClientResult:
    """Run :func:`_client` in ``process`` (a new :func:`client_process` when None) and return
    what it saw (``probe_every=0``: commands only, no probe)."""
    args = (url, rate, seconds, keys, probe_every)
    # Every request and probe is bounded (ANSWER_TIMEOUT_S, PROBE_TIMEOUT_S): so is the round.
    bound = seconds + ANSWER_TIMEOUT_S + PROBE_TIMEOUT_S + 60
    with contextlib.nullcontext(process) if process is not None else client_process() as pool:
        return pool.apply_async(_client, args).get(timeout=bound)


def _ready() -> None:
    """Nothing: the spawned process has imported this module once it ran."""


def _client(url: str, rate: float, seconds: float, keys: int, probe_every: int) -> ClientResult:
    result = ClientResult()
    rng = random.Random(5)
    address = urllib.parse.urlsplit(url)
    host, port = address.hostname or "127.0.0.1", address.port or 80

    async def probe(connection: Connection, key: str, version: int) -> float | None:
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                status, body, _ = await asyncio.wait_for(
                    connection.request("GET", f"/stores/stock/keys/{key}"),
                    max(0.001, deadline - time.monotonic()),
                )
            except TimeoutError:
                connection.close()
                return None
            if status == 200 and json.loads(body)["value"]["on_hand"] >= version - 1:
                return time.monotonic()
            await asyncio.sleep(0.005)  # nothing to await: the API has no change feed
        return None

    async def command(connection: Connection, n: int) -> None:
        key = sku(rng.randrange(keys))
        sent = time.monotonic()
        try:
            status, body, _ = await asyncio.wait_for(
                connection.request(
                    "POST", f"/commands/product/{key}/receive_shipment", b'{"quantity":1}'
                ),
                ANSWER_TIMEOUT_S,
            )
        except (ConnectionError, TimeoutError):
            connection.close()  # an answer may still come: the connection starts afresh
            result.failed += 1
            return
        if status != 200:
            result.failed += 1
            return
        acknowledged = time.monotonic()
        result.ack_ms.append((acknowledged - sent) * 1e3)
        if probe_every and n % probe_every == 0:
            answer = json.loads(body)
            visible = await probe(connection, key, answer["events"][-1]["version"])
            position = answer["position"]
            result.probes.append(
                Probe(position["partition"], position["offset"], acknowledged, visible)
            )

    async def run() -> None:
        # Open loop on schedule, but at most IN_FLIGHT commands outstanding (one connection
        # each): an instance that cannot keep up lowers the achieved rate (reported) instead
        # of queueing in the client.
        idle: asyncio.Queue[Connection] = asyncio.Queue()
        for _ in range(IN_FLIGHT):
            idle.put_nowait(Connection(host, port))

        async def on(connection: Connection, n: int) -> None:
            try:
                await command(connection, n)
            finally:
                idle.put_nowait(connection)

        tasks = []
        started = time.monotonic()
        for n in range(int(rate * seconds)):
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # commands leave on schedule
            connection = await idle.get()
            if time.monotonic() - started > seconds:
                break  # the run lasts ``seconds``, whatever rate the instance sustains
            tasks.append(asyncio.create_task(on(connection, n)))
        await asyncio.gather(*tasks)
        result.seconds = time.monotonic() - started
        result.sent = len(tasks)
        while not idle.empty():
            idle.get_nowait().close()

    cpu = time.process_time()
    asyncio.run(run())
    result.cpu_s = time.process_time() - cpu
    return result


class TailingFold:
    """The reference: a plain consumer tailing ``topic`` from its end (found before any command
    is sent), folding each poll batch
    and partition with ``fold_partition`` (one WriteBatch of values + offset, writers kept
    open), noting ``(time, last offset)`` of every commit per partition."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, state_dir: Path) -> None:
        self.projection = service.projection("stock")
        self.writers = {
            p: RocksDBWriter(partition_path(state_dir, "stock", p), identity=f"{topic}/{p}")
            for p in range(partitions)
        }
        self.commits: dict[int, list[tuple[int, float]]] = {p: [] for p in range(partitions)}
        ends = ProbedEnds(bootstrap, topic, list(range(partitions)))
        try:
            starts = ends.ends()  # the last stable offsets: where a committed reader starts
        finally:
            ends.close()
        self.consumer = Consumer(consumer_config(bootstrap, fetch_wait_max_ms=10))
        self.consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailing-fold", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            fetched = consume_available(self.consumer, 10_000, 0.05)
            by_partition = records_of_messages([m for m in fetched if m.error() is None])
            for partition, records in by_partition.items():
                done = fold_partition(self.projection, self.writers[partition], records, None)
                if done is not None:
                    self.commits[partition].append((done[1], time.monotonic()))

    def visible_at(self, partition: int, offset: int) -> float | None:
        """When the commit holding ``offset`` of ``partition`` was written."""
        commits = self.commits[partition]
        index = bisect.bisect_left(commits, offset, key=lambda c: c[0])
        return commits[index][1] if index < len(commits) else None

    def __enter__(self) -> TailingFold:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.consumer.close()
        for writer in self.writers.values():
            writer.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]
