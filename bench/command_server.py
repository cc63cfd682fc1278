"""The reference beside the commands-per-CPU-second figure: the least a Starlette + uvicorn app does
to take ``POST /commands/product/{id}/receive_shipment`` and append the inventory's
``ShipmentReceived`` event for it, with no aggregate, no validation, no routing.

Each request's event is built by hand, as the command side's codec encodes it (the same value
and headers: type, version, a fresh event id, timestamp; the version counts the app's own
appends per product), and queued for its partition (murmur2, as the command side's). Group
commit as the command side's: one transactional producer per partition, one transaction at a
time, the requests that queue meanwhile in the next one (at most the command side's records per
transaction), with the instance's default linger; each request is answered with its offset once
its transaction committed.

    python -m bench.command_server --bootstrap B --topic T --partitions N --port P
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from foldstream.commands.group_commit import MAX_RECORDS_PER_TRANSACTION
from foldstream.kafka import partition_for, producer_config
from foldstream.settings import Settings

EVENT_TYPE = b"foldstream.examples.inventory.domain:Product.ShipmentReceived"
TRANSACTION_TIMEOUT_S = 10.0
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


class PlainGroupCommit:
    """Appends records to ``topic``'s partitions, one transaction at a time per partition."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, linger_ms: int) -> None:
        self.topic = topic
        self.producers = [
            Producer(
                producer_config(
                    bootstrap, linger_ms=linger_ms, **{"transactional.id": f"{topic}.{p}"}
                )
            )
            for p in range(partitions)
        ]
        self.queues: list[list[tuple[Record, asyncio.Future[int]]]] = [[] for _ in self.producers]
        self.flushing = [False] * partitions
        self.executor = ThreadPoolExecutor(partitions)

    def start(self) -> None:
        for producer in self.producers:
            producer.init_transactions(TRANSACTION_TIMEOUT_S)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        for producer in self.producers:
            producer.flush(TRANSACTION_TIMEOUT_S)

    def append(self, partition: int, record: Record) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self.queues[partition].append((record, done))
        if not self.flushing[partition]:
            self.flushing[partition] = True
            loop.create_task(self._flush(partition))
        return done

    async def _flush(self, partition: int) -> None:
        loop = asyncio.get_running_loop()
        queue = self.queues[partition]
        try:
            while queue:
                batch = queue[:MAX_RECORDS_PER_TRANSACTION]
                del queue[:MAX_RECORDS_PER_TRANSACTION]
                records = [record for record, _ in batch]
                try:
                    offsets = await loop.run_in_executor(
                        self.executor, self._transaction, partition, records
                    )
                except Exception as exc:  # noqa: BLE001 - handed to every request of the batch
                    for _, waiter in batch:
                        waiter.set_exception(exc)
                    continue
                for (_, waiter), offset in zip(batch, offsets, strict=True):
                    waiter.set_result(offset)
        finally:
            self.flushing[partition] = False

    def _transaction(self, partition: int, records: list[Record]) -> list[int]:
        producer = self.producers[partition]
        delivered: list[Any] = []
        producer.begin_transaction()
        for key, value, headers in records:
            producer.produce(
                self.topic,
                key=key,
                value=value,
                headers=headers,
                partition=partition,
                on_delivery=lambda _, message: delivered.append(message),
            )
        producer.commit_transaction(TRANSACTION_TIMEOUT_S)
        return [int(message.offset()) for message in delivered]


def plain_command_app(bootstrap: str, topic: str, partitions: int) -> Starlette:
    """``POST /commands/product/{id}/receive_shipment`` and ``GET /health``, nothing else."""
    committer = PlainGroupCommit(bootstrap, topic, partitions, Settings().linger_ms)
    versions: dict[str, int] = {}

    async def receive_shipment(request: Request) -> Response:
        product = request.path_params["id"]
        quantity = int(json.loads(await request.body())["quantity"])
        now = datetime.now(UTC).isoformat().encode()
        version = versions[product] = versions.get(product, 0) + 1
        value = b'{"timestamp":{"_type_":"datetime_iso","_data_":"%s"},"quantity":%d}' % (
            now,
            quantity,
        )
        headers = [
            ("event-type", EVENT_TYPE),
            ("version", b"%d" % version),
            ("event-id", uuid.uuid4().hex.encode()),
            ("timestamp", now),
        ]
        key = product.encode()
        partition = partition_for(key, partitions)
        offset = await committer.append(partition, (key, value, headers))
        body = b'{"partition":%d,"offset":%d}' % (partition, offset)
        return Response(body, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"alive"}', media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(committer.start)
        try:
            yield
        finally:
            await asyncio.to_thread(committer.close)

    return Starlette(
        routes=[
            Route("/commands/product/{id}/receive_shipment", receive_shipment, methods=["POST"]),
            Route("/health", health),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import uvicorn

    app = plain_command_app(args.bootstrap, args.topic, args.partitions)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
