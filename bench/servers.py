"""Query servers run beside an instance, as separate processes over the same stores.

``minimal``: the reference — the least a Starlette + uvicorn app does to answer a GET by key
from RocksDB (a rocksdict get, stored bytes as they are) and a batch of keys. It opens the
stores with the options they were written with (PlainTable), so it gets the same lookup speed.
``foldstream-uvicorn`` / ``foldstream-granian``: foldstream's own query routes
(:func:`foldstream.query_api.query_routes`) without the rest of an instance, served by uvicorn or
granian — variants that show what the HTTP server costs per lookup.

    python -m bench.servers KIND --state-dir DIR --store S --partitions N --partitioner P --port N
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_delay,
    wait_fixed,
)

from foldstream.errors import FoldstreamError
from foldstream.kafka import Partitioner, partition_for
from foldstream.state.format import ORDERED_FORMAT, TABLE_FORMAT

if TYPE_CHECKING:  # the minimal reference server loads none of foldstream's query side
    from foldstream.query_api.fast_lookup import FastLookups

KINDS = ("minimal", "foldstream-uvicorn", "foldstream-granian", "minimal-range")


def open_read_only(
    state_dir: Path, store: str, partitions: int, table_format: str = TABLE_FORMAT
) -> list[Any]:
    """The store's partition databases, opened read-only with the options they were written
    with (rocksdict's own ``Rdict``: the least a server can read them through)."""
    from rocksdict import AccessType, Rdict

    from foldstream.state import partition_path
    from foldstream.state.format import store_options

    return [
        Rdict(
            str(partition_path(state_dir, store, p)),
            options=store_options(table_format),
            access_type=AccessType.read_only(),
        )
        for p in range(partitions)
    ]


#: The reference servers that open the stores read-only once and read that view while they run,
#: with the format each opens.
SNAPSHOT_KINDS = {"minimal": TABLE_FORMAT, "minimal-range": ORDERED_FORMAT}


def await_flushed(
    state_dir: Path, store: str, partitions: int, table_format: str = TABLE_FORMAT
) -> None:
    """Wait (up to a minute) until no partition of ``store`` holds as many unflushed writes as
    an instance flushes (:data:`~foldstream.state.host.IDLE_FLUSH_ENTRIES`): it flushes a
    partition no task wrote for a few seconds. A read-only open replays the writer's log into a
    memtable of its own and keeps it while it is open, so a reference server opened before that
    flush reads up to a memtable's worth of keys from a skiplist while the instance reads them
    from its table files (docs/benchmarks.md, "The reference read a memtable of its own")."""
    from foldstream.state.host import IDLE_FLUSH_ENTRIES  # not in the reference servers

    def unflushed() -> int:
        dbs = open_read_only(state_dir, store, partitions, table_format)
        try:
            return max(
                (db.property_int_value("rocksdb.num-entries-active-mem-table") or 0 for db in dbs),
                default=0,
            )
        finally:
            for db in dbs:
                db.close()

    try:
        Retrying(
            stop=stop_after_delay(60),
            wait=wait_fixed(0.25),
            # An open can also fail while the writer switches files (a flush, a compaction).
            retry=retry_if_result(lambda left: left >= IDLE_FLUSH_ENTRIES)
            | retry_if_exception_type(Exception),
        )(unflushed)
    except RetryError:
        raise FoldstreamError(
            f"{store}: a partition still holds unflushed writes (or cannot be opened) after 60 s;"
            " the instance flushes them once its fold stopped writing (is it still folding?)"
        ) from None


def minimal_app(
    state_dir: Path, store: str, partitions: int, partitioner: Partitioner
) -> Starlette:
    """GET ``/stores/{store}/keys/{key}`` and POST ``/stores/{store}/keys``, nothing else."""
    dbs = open_read_only(state_dir, store, partitions)

    async def get_key(request: Request) -> Response:
        key = request.path_params["key"]
        raw = key.encode()
        value = dbs[partition_for(raw, partitions, partitioner)].get(raw)
        if value is None:
            return Response(b'{"error":"no such key"}', 404, media_type="application/json")
        body = b'{"key":' + encode_basestring_ascii(key).encode() + b',"value":' + value + b"}"
        return Response(body, media_type="application/json")

    async def get_keys(request: Request) -> Response:
        found = []
        for key in json.loads(await request.body()):
            raw = key.encode()
            value = dbs[partition_for(raw, partitions, partitioner)].get(raw)
            if value is not None:
                found.append(encode_basestring_ascii(key).encode() + b":" + value)
        return Response(b'{"values":{' + b",".join(found) + b"}}", media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"alive"}', media_type="application/json")

    return Starlette(
        routes=[
            Route(f"/stores/{store}/keys/{{key:path}}", get_key),
            Route(f"/stores/{store}/keys", get_keys, methods=["POST"]),
            Route("/health", health),
        ]
    )


def foldstream_app() -> FastLookups:
    """foldstream's query routes (with the lookup fast path, as an instance serves them) over
    the stores named by ``BENCH_QUERY_*`` (a granian factory)."""
    from foldstream.query_api import StoreReaders, query_routes
    from foldstream.query_api.fast_lookup import FastLookups
    from foldstream.query_api.stores import StoreInfo
    from foldstream.routing import LocalOnly

    env = os.environ
    partitions = int(env["BENCH_QUERY_PARTITIONS"])
    readers = StoreReaders.at(
        Path(env["BENCH_QUERY_STATE_DIR"]),
        {
            env["BENCH_QUERY_STORE"]: StoreInfo(
                "bench",
                partitions,
                env["BENCH_QUERY_PARTITIONER"],  # type: ignore[arg-type]
            )
        },
    )
    owned = frozenset(range(partitions))
    locator = LocalOnly(lambda: owned)
    routes = Starlette(
        routes=query_routes(lambda: readers, lambda: locator, lambda: (True, {}), dict)
    )
    return FastLookups(routes, readers=lambda: readers, locator=lambda: locator)


class ServerProcess:
    """``python -m bench.servers KIND ...`` on ``port``; stopped by its own PID."""

    def __init__(
        self,
        kind: str,
        *,
        state_dir: Path,
        store: str,
        partitions: int,
        partitioner: str,
        port: int,
    ) -> None:
        self.kind = kind
        self.store_args = (Path(state_dir), store, partitions)
        self.url = f"http://127.0.0.1:{port}"
        self.args = [
            sys.executable, "-m", "bench.servers", kind, "--state-dir", str(state_dir),
            "--store", store, "--partitions", str(partitions), "--partitioner", partitioner,
            "--port", str(port),
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __enter__(self) -> ServerProcess:
        if self.kind in SNAPSHOT_KINDS:
            await_flushed(*self.store_args, SNAPSHOT_KINDS[self.kind])
        root = str(Path(__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        self.process = subprocess.Popen(self.args, env=env, stdin=subprocess.DEVNULL)
        wait_http(f"{self.url}/health", self.process)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_http(
    url: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 60
) -> None:
    """Wait until ``url`` answers 200 (a server's port opens only once it is up)."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        if process is not None and process.poll() is not None:
            raise FoldstreamError(f"{url}: server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise FoldstreamError(f"{url} did not answer within {timeout}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--partitioner", default="murmur2")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.kind in ("minimal", "minimal-range"):
        import uvicorn

        from bench.range_server import minimal_range_app

        make = minimal_app if args.kind == "minimal" else minimal_range_app
        app: Any = make(args.state_dir, args.store, args.partitions, args.partitioner)
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
        return
    os.environ.update(
        BENCH_QUERY_STATE_DIR=str(args.state_dir),
        BENCH_QUERY_STORE=args.store,
        BENCH_QUERY_PARTITIONS=str(args.partitions),
        BENCH_QUERY_PARTITIONER=args.partitioner,
    )
    if args.kind == "foldstream-uvicorn":
        import uvicorn

        from foldstream.query_api.lookup_protocol import lookup_protocol

        app = foldstream_app()  # with the lookup protocol, as an instance serves on uvicorn
        uvicorn.run(
            app, http=lookup_protocol(app), host="127.0.0.1", port=args.port, log_level="warning"
        )
        return
    from granian import Granian
    from granian.constants import Interfaces

    Granian(
        "bench.servers:foldstream_app",
        port=args.port,
        interface=Interfaces.ASGI,
        factory=True,
        log_enabled=False,
    ).serve()


if __name__ == "__main__":
    main()
