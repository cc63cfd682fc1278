"""foldstream.client against a real 3-instance cluster (real broker, Spark, RocksDB, HTTP):
routing by the cluster map, batches split by owner, redirects, typed errors, and a ``kill -9``
of an instance while the client keeps answering, every answer right."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from foldstream.client import (
    AsyncFoldstreamClient,
    BadRequest,
    FoldstreamClient,
    KeyNotFound,
    NotFound,
    Rejected,
    VersionConflict,
)
from foldstream.process import InstanceProcess
from foldstream.testing.plugin import InstancePool

SERVICE = "foldstream.examples.inventory:service"
KEYS = [f"client-sku-{n}" for n in range(16)]
#: What the store should hold for each key, kept up to date by the tests (they run in order).
EXPECTED: dict[str, int] = {}


@pytest.fixture(scope="module")
def cluster(instances: InstancePool) -> list[InstanceProcess]:
    return instances.cluster(SERVICE, 3)


class Recorder:
    """The requests a client sent and the status of each answer (httpx event hooks)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def __call__(self, response: httpx.Response) -> None:
        request = response.request
        self.seen.append((request.method, str(request.url), response.status_code))

    async def hook(self, response: httpx.Response) -> None:
        self(response)

    def statuses(self, path_part: str) -> list[int]:
        return [status for _, url, status in self.seen if path_part in url]


def until(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """``check()``'s first true result, asked until ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except KeyNotFound as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    raise AssertionError(f"still {last!r} after {timeout}s")


def on_hand(client: FoldstreamClient) -> dict[str, int]:
    batch = client.get_many("stock", KEYS)
    return {key: value["on_hand"] for key, value in batch.values.items()}


@pytest.fixture
def recorded(cluster: list[InstanceProcess]) -> Iterator[tuple[FoldstreamClient, Recorder]]:
    recorder = Recorder()
    http = httpx.Client(timeout=10, event_hooks={"response": [recorder]})
    with FoldstreamClient(cluster[0].url, http=http, retry_timeout=60) as client:
        yield client, recorder
    http.close()


def test_commands_and_lookups_go_straight_to_the_owners(
    recorded: tuple[FoldstreamClient, Recorder], cluster: list[InstanceProcess]
) -> None:
    client, recorder = recorded
    for n, key in enumerate(KEYS):
        answer = client.command("product", key, "receive_shipment", {"quantity": n + 1})
        assert [e.type for e in answer.events] == ["Product.Created", "Product.ShipmentReceived"]
        EXPECTED[key] = n + 1
    for key in KEYS:
        lookup = until(lambda key=key: client.lookup("stock", key))
        assert lookup.value == {"on_hand": EXPECTED[key]}
        assert lookup.served_by.role == "active"
    cluster_map = client.cluster()
    assert len(cluster_map.instances) == 3
    assert cluster_map.commands is not None and cluster_map.commands.topic == "inventory.events"
    # Routed by the map: no redirect, and the keys' owners are all three instances.
    assert 307 not in recorder.statuses("/commands/") + recorder.statuses("/stores/")
    ports = {urlsplit(url).port for _, url, _ in recorder.seen if "/commands/" in url}
    assert ports == {urlsplit(i.url).port for i in cluster}


def test_a_batch_is_split_by_owner(
    recorded: tuple[FoldstreamClient, Recorder], cluster: list[InstanceProcess]
) -> None:
    client, recorder = recorded
    batch = client.get_many("stock", [*KEYS, "client-sku-none"])
    assert batch.missing == ["client-sku-none"]
    assert {k: v["on_hand"] for k, v in batch.values.items()} == EXPECTED
    posts = [url for method, url, _ in recorder.seen if method == "POST"]
    owners = {client.owners("stock", key).active for key in [*KEYS, "client-sku-none"]}
    assert sorted(urlsplit(url).port for url in posts) == sorted(
        urlsplit(str(owner)).port for owner in owners
    )


def test_typed_errors(recorded: tuple[FoldstreamClient, Recorder]) -> None:
    client, _ = recorded
    with pytest.raises(KeyNotFound):
        client.get("stock", "client-sku-none")
    with pytest.raises(NotFound, match="no store named 'nope'"):
        client.get("nope", "x")
    with pytest.raises(BadRequest, match="argument 'quantity' must be int"):
        client.command("product", KEYS[0], "sell", {"quantity": "two"})
    with pytest.raises(Rejected, match="on hand"):
        client.command("product", KEYS[0], "sell", {"quantity": 10_000})
    with pytest.raises(VersionConflict) as conflict:
        client.command("product", KEYS[0], "sell", {"quantity": 1}, expected_version=0)
    assert (conflict.value.expected_version, conflict.value.current_version) == (0, 2)


def test_the_async_client_follows_redirects_when_not_routing(
    cluster: list[InstanceProcess],
) -> None:
    recorder = Recorder()

    async def run() -> tuple[list[Any], Any]:
        http = httpx.AsyncClient(timeout=10, event_hooks={"response": [recorder.hook]})
        async with AsyncFoldstreamClient(cluster[1].url, route=False, http=http) as client:
            values = await asyncio.gather(*(client.get("stock", key) for key in KEYS))
            batch = await client.get_many("stock", KEYS)
        await http.aclose()
        return values, batch

    values, batch = asyncio.run(run())
    assert [v["on_hand"] for v in values] == [EXPECTED[key] for key in KEYS]
    assert {k: v["on_hand"] for k, v in batch.values.items()} == EXPECTED
    lookups = recorder.statuses("/stores/stock/keys/")
    assert 307 in lookups and lookups.count(200) == len(KEYS)
    hops = [url for _, url, status in recorder.seen if status == 200 and "hops=1" in url]
    assert hops, "the redirected lookups carried the hop counter"


def test_foldstream_status_prints_the_cluster(cluster: list[InstanceProcess]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foldstream", "status", cluster[1].url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 members" in done.stdout and "settled" in done.stdout
    for instance in cluster:
        assert instance.url in done.stdout
    assert done.stdout.count("ready") >= 3
    for partition in range(4):
        # the stores folding the partition, ``stock`` among them (``sales_10m``...)
        assert re.search(rf"inventory\.events\s*│\s*{partition}\s*│[^│\n]*\bstock\b", done.stdout)


def test_kill_9_of_an_owner_while_the_client_keeps_answering(
    cluster: list[InstanceProcess],
) -> None:
    seeds = [i.url for i in cluster]
    victim = cluster[2]
    stop = threading.Event()
    passes = {"before": 0, "after": 0}
    wrong: list[str] = []
    failures: list[BaseException] = []
    killed = threading.Event()

    def read_all() -> None:
        with FoldstreamClient(seeds, retry_timeout=90) as reader:
            while not stop.is_set():
                try:
                    for key in KEYS:
                        value = reader.get("stock", key)
                        if value != {"on_hand": EXPECTED[key]}:
                            wrong.append(f"{key}: {value}")
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    failures.append(exc)
                    return
                passes["after" if killed.is_set() else "before"] += 1

    reader = threading.Thread(target=read_all, name="client-reader")
    reader.start()
    try:
        until(lambda: passes["before"] >= 1 or failures, 60)
        victim.kill()
        killed.set()
        until(lambda: passes["after"] >= 3 or failures, 120)
    finally:
        stop.set()
        reader.join(120)
    assert failures == [] and wrong == []
    with FoldstreamClient(seeds, retry_timeout=90) as client:
        # Commands go on too: those of the victim's partitions once another instance owns them.
        for key in KEYS:
            client.command("product", key, "receive_shipment", {"quantity": 1})
            EXPECTED[key] += 1
        assert until(lambda: on_hand(client) == EXPECTED, 60)
        until(lambda: victim.url not in {m.url for m in client.cluster().instances}, 30)
