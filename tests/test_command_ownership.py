"""The command side owns partitions: fencing, expected versions, revoke and re-assign, HTTP.

Handlers are built directly on the inventory example's aggregates, on the session's broker; no
Spark. Each test writes its own topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.message import Message
from typing import Any

import pytest
from starlette.applications import Starlette

from foldstream.broker import KafkaCluster
from foldstream.commands import CommandHandler, CommandResult, VersionConflict
from foldstream.commands.http import command_routes
from foldstream.commands.ownership import IDLE_WAIT_S, CommandPartitions
from foldstream.domain.records import HEADER_VERSION
from foldstream.errors import BrokerUnavailable, NotOwner, PartitionFenced
from foldstream.examples.inventory import service
from foldstream.kafka import TopicSpec, ensure_topics
from foldstream.routing import LocalOnly
from foldstream.testing.asgi import uvicorn_thread
from foldstream.testing.kafka import read_topic
from foldstream.testing.scenario import wait_until

PARTITIONS = 4


def new_topic(broker: KafkaCluster) -> str:
    name = f"own-{uuid.uuid4().hex[:8]}.events"
    ensure_topics(broker.bootstrap, [TopicSpec(name, PARTITIONS)])
    return name


@contextlib.contextmanager
def handlers(
    broker: KafkaCluster, topic: str, count: int, **options: Any
) -> Iterator[list[CommandHandler]]:
    """``count`` started handlers of the inventory service (or of ``aggregates=``) on
    ``topic``, closed afterwards."""
    options.setdefault("aggregates", service.aggregates)
    made = [
        CommandHandler(
            bootstrap=broker.bootstrap,
            topic=topic,
            partitions=PARTITIONS,
            **options,
        )
        for _ in range(count)
    ]
    for handler in made:
        handler.start()
    try:
        yield made
    finally:
        for handler in made:
            handler.close()


def events_in(broker: KafkaCluster, topic: str, partition: int) -> list[tuple[str, int]]:
    """(aggregate id, version) of every record of ``partition``, in offset order."""
    return [
        (key.decode(), int(dict(headers)[HEADER_VERSION]))
        for p, _, key, _, headers in read_topic(broker.bootstrap, topic, PARTITIONS)
        if p == partition
    ]


def key_in(handler: CommandHandler, partition: int, prefix: str) -> str:
    """An aggregate id whose events live in ``partition``."""
    return next(
        key
        for key in (f"{prefix}-{n}" for n in range(1000))
        if handler.partition_of(key) == partition
    )


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def test_a_new_owner_fences_the_old_one_and_continues_its_versions(
    broker: KafkaCluster,
) -> None:
    topic = new_topic(broker)

    async def scenario() -> None:
        with handlers(broker, topic, 2) as (a, b):
            assert await asyncio.to_thread(a.assign, range(PARTITIONS)) == 0
            assert a.owned() == frozenset(range(PARTITIONS))
            key = key_in(a, 1, "fence")
            other = key_in(a, 2, "fence")
            await a.handle("product", key, "receive_shipment", {"quantity": 5})
            await a.handle("product", key, "sell", {"quantity": 1})

            assert await asyncio.to_thread(b.assign, [1]) == 3
            assert b.owned() == {1}
            assert b.version(key) == a.version(key) == 3
            before = events_in(broker, topic, 1)

            with pytest.raises(PartitionFenced) as fenced:
                await a.handle("product", key, "sell", {"quantity": 1})
            assert fenced.value.partition == 1
            assert a.owned() == {0, 2, 3}
            with pytest.raises(NotOwner):
                await a.handle("product", key, "sell", {"quantity": 1})
            assert events_in(broker, topic, 1) == before
            # A still writes the partitions nobody took from it.
            await a.handle("product", other, "receive_shipment", {"quantity": 1})

            result = await b.handle("product", key, "sell", {"quantity": 1}, expected_version=3)
            assert result.events == [{"type": "Product.ItemsSold", "version": 4, "quantity": 1}]
            assert result.partition == 1
            assert events_in(broker, topic, 1) == [*before, (key, 4)]

    run(scenario)


class TakeOverBeforeCommit:
    """A producer whose partition another writer takes over between produce and commit."""

    def __init__(self, producer: Any, take_over: Callable[[], object]) -> None:
        self._producer = producer
        self._take_over = take_over

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def commit_transaction(self, timeout: float) -> None:
        self._take_over()
        try:
            self._producer.commit_transaction(timeout)
        finally:
            # Like the writer, let go of the producer (the error's traceback keeps this frame).
            self._producer = None


def test_a_writer_fenced_mid_transaction_gives_its_partition_up(broker: KafkaCluster) -> None:
    """Kafka answers the commit with 'fenced': the old writer keeps nothing in memory and
    releases the partition, and the new owner's state is what a replay of the partition gives."""
    topic = new_topic(broker)
    released: list[tuple[int, Exception]] = []

    async def scenario() -> None:
        with (
            handlers(
                broker,
                topic,
                1,
                transaction_timeout=1.0,
                on_released=lambda p, e: released.append((p, e)),
            ) as (a,),
            handlers(broker, topic, 2) as (b, check),
        ):
            await asyncio.to_thread(a.assign, range(PARTITIONS))
            key = key_in(a, 3, "mid")
            await a.handle("product", key, "receive_shipment", {"quantity": 5})
            writer = a._writers[3]
            writer._producer = TakeOverBeforeCommit(writer._producer, lambda: b.assign([3]))

            with pytest.raises((PartitionFenced, BrokerUnavailable)) as failed:
                await a.handle("product", key, "sell", {"quantity": 1})

            assert released == [(3, failed.value)]
            assert a.owned() == {0, 1, 2}
            assert len(writer.aggregates) == 0
            result = await b.handle(
                "product", key, "sell", {"quantity": 1}, expected_version=b.version(key)
            )
            await asyncio.to_thread(check.assign, [3])
            assert check.version(key) == b.version(key) == result.events[-1]["version"]

    run(scenario)


def test_a_partition_fenced_by_another_writer_is_taken_again_only_after_the_fenced_wait(
    broker: KafkaCluster,
) -> None:
    """Fenced, the old writer's instance may have stood still and lost the partition: taking it
    at once would fence the new owner in turn, so the cluster gets the wait to say so."""
    topic = new_topic(broker)

    async def scenario() -> None:
        with handlers(broker, topic, 2) as (a, b):
            partitions = CommandPartitions(a, fenced_wait_s=2.0)
            partitions.start()
            try:
                partitions.own([3])
                await asyncio.to_thread(wait_until, lambda: a.owned() == {3}, lambda: "not taken")
                key = key_in(a, 3, "fenced")
                await a.handle("product", key, "receive_shipment", {"quantity": 5})
                await asyncio.to_thread(b.assign, [3])
                with pytest.raises(PartitionFenced):
                    await a.handle("product", key, "sell", {"quantity": 1})
                fenced_at = time.monotonic()
                await b.handle("product", key, "sell", {"quantity": 1})  # b's writer still works
                await asyncio.to_thread(
                    wait_until, lambda: a.owned() == {3}, lambda: "never taken again"
                )
                assert time.monotonic() - fenced_at >= 2.0
            finally:
                partitions.close()

    run(scenario)


def test_no_partition_is_taken_while_the_cluster_view_is_not_current(
    broker: KafkaCluster,
) -> None:
    """An instance that stood still may have lost its partitions without knowing yet: opening
    a writer then would fence the new owner's."""
    topic = new_topic(broker)
    current = False

    with handlers(broker, topic, 1) as (a,):
        partitions = CommandPartitions(a, may_take=lambda: current)
        partitions.start()
        try:
            partitions.own([3])
            held_back_until = time.monotonic() + 2 * IDLE_WAIT_S
            while time.monotonic() < held_back_until:  # the absence of a take, over two wakes
                assert a.owned() == frozenset()
                time.sleep(0.05)
            current = True
            wait_until(lambda: a.owned() == {3}, lambda: "not taken once the view is current")
        finally:
            partitions.close()


def test_concurrent_commands_expecting_one_version_append_once(broker: KafkaCluster) -> None:
    topic = new_topic(broker)

    async def scenario() -> None:
        with handlers(broker, topic, 1) as (handler,):
            await asyncio.to_thread(handler.assign, range(PARTITIONS))
            key = "race-1"
            partition = handler.partition_of(key)
            await handler.handle("product", key, "receive_shipment", {"quantity": 10})
            before = events_in(broker, topic, partition)

            outcomes = await asyncio.gather(
                *(
                    handler.handle("product", key, "sell", {"quantity": 1}, expected_version=2)
                    for _ in range(8)
                ),
                return_exceptions=True,
            )

            assert [type(o) for o in outcomes].count(CommandResult) == 1
            conflicts = [o for o in outcomes if isinstance(o, VersionConflict)]
            assert len(conflicts) == 7
            assert {(c.expected, c.current) for c in conflicts} == {(2, 3)}
            assert events_in(broker, topic, partition) == [*before, (key, 3)]
            assert handler.version(key) == 3

    run(scenario)


def test_revoke_stops_commands_and_assign_replays_the_same_versions(
    broker: KafkaCluster,
) -> None:
    topic = new_topic(broker)

    async def scenario() -> None:
        with handlers(broker, topic, 1) as (handler,):
            await asyncio.to_thread(handler.assign, range(PARTITIONS))
            keys = [f"re-{n}" for n in range(12)]
            for n, key in enumerate(keys):
                await handler.handle("product", key, "receive_shipment", {"quantity": 100})
                for _ in range(n % 3):
                    await handler.handle("product", key, "sell", {"quantity": 1})
            versions = {key: handler.version(key) for key in keys}
            key = keys[0]
            partition = handler.partition_of(key)

            # Revoke while commands of the partition are queued and in flight: those that
            # succeeded are in the log, the others appended nothing, and nothing lands after.
            commands = [
                asyncio.ensure_future(handler.handle("product", key, "sell", {"quantity": 1}))
                for _ in range(20)
            ]
            await asyncio.sleep(0)  # let every command queue its events for the partition
            await asyncio.to_thread(handler.revoke, [partition])
            at_revoke = events_in(broker, topic, partition)
            outcomes = await asyncio.gather(*commands, return_exceptions=True)
            sold = [o for o in outcomes if isinstance(o, CommandResult)]
            assert all(isinstance(o, (CommandResult, NotOwner)) for o in outcomes), outcomes
            assert [e["version"] for r in sold for e in r.events] == [
                versions[key] + n for n in range(1, len(sold) + 1)
            ]
            assert events_in(broker, topic, partition) == at_revoke
            versions[key] += len(sold)

            assert partition not in handler.owned()
            with pytest.raises(NotOwner) as refused:
                await handler.handle("product", key, "sell", {"quantity": 1})
            assert refused.value.partition == partition
            assert not isinstance(refused.value, PartitionFenced)

            replayed = await asyncio.to_thread(handler.assign, [partition])
            assert replayed == len(at_revoke)
            assert {k: handler.version(k) for k in keys} == versions
            result = await handler.handle(
                "product", key, "sell", {"quantity": 1}, expected_version=versions[key]
            )
            assert result.events[0]["version"] == versions[key] + 1

    run(scenario)


@dataclass
class Web:
    url: str
    handler: CommandHandler

    def post(
        self, path: str, body: object, headers: dict[str, str] | None = None
    ) -> tuple[int, Message, Any]:
        """POST JSON; (status, headers, decoded body) whatever the status."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), method="POST"
        )
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.headers, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, json.loads(exc.read())


@pytest.fixture(scope="module")
def web(broker: KafkaCluster) -> Iterator[Web]:
    """The command routes on a real uvicorn (127.0.0.1, free port) over a handler owning all."""
    with handlers(broker, new_topic(broker), 1) as (handler,):
        handler.assign(range(PARTITIONS))
        app = Starlette(routes=command_routes(lambda: handler, lambda: LocalOnly(handler.owned)))
        with uvicorn_thread(app) as url:
            yield Web(url, handler)


def test_conflicting_commands_over_http_get_409(web: Web) -> None:
    status, _, body = web.post("/commands/product/web-1/receive_shipment", {"quantity": 10})
    assert status == 200, body
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(
            pool.map(
                lambda _: web.post(
                    "/commands/product/web-1/sell?expected_version=2", {"quantity": 1}
                ),
                range(8),
            )
        )
    assert sorted(status for status, _, _ in answers) == [200] + [409] * 7
    conflict = next(body for status, _, body in answers if status == 409)
    assert conflict["expected_version"] == 2 and conflict["current_version"] == 3
    assert "'web-1' is at version 3, not 2" in conflict["error"]

    status, _, body = web.post(
        "/commands/product/web-1/sell", {"quantity": 1}, headers={"If-Match": "3"}
    )
    assert status == 200 and body["events"][0]["version"] == 4
    status, _, body = web.post(
        "/commands/product/web-1/sell", {"quantity": 1}, headers={"If-Match": '"4"'}
    )
    assert status == 200 and body["events"][0]["version"] == 5
    status, _, body = web.post(
        "/commands/product/web-new/receive_shipment?expected_version=0", {"quantity": 1}
    )
    assert status == 200 and [e["version"] for e in body["events"]] == [1, 2]


@pytest.mark.parametrize(
    ("query", "headers", "message"),
    [
        ("?expected_version=two", {}, "expected_version must be a non-negative integer"),
        ("?expected_version=-1", {}, "expected_version must be a non-negative integer"),
        ("?expected_version=1.0", {}, "expected_version must be a non-negative integer"),
        ("?expected_version=", {}, "expected_version must be a non-negative integer"),
        ("", {"If-Match": "*"}, "If-Match must be a non-negative integer"),
        ("", {"If-Match": 'W/"1"'}, "If-Match must be a non-negative integer"),
        ("?expected_version=1", {"If-Match": "2"}, "disagree"),
    ],
)
def test_a_bad_expected_version_is_400_and_appends_nothing(
    web: Web, query: str, headers: dict[str, str], message: str
) -> None:
    version = web.handler.version("web-bad")
    status, _, body = web.post(
        f"/commands/product/web-bad/receive_shipment{query}", {"quantity": 1}, headers
    )
    assert status == 400 and message in body["error"], body
    assert web.handler.version("web-bad") == version


def test_a_partition_not_owned_is_503_naming_it(web: Web) -> None:
    partition = web.handler.partition_of("web-away")
    web.handler.revoke([partition])
    try:
        status, headers, body = web.post("/commands/product/web-away/sell", {"quantity": 1})
    finally:
        web.handler.assign([partition])
    assert status == 503 and headers["Retry-After"] == "1"
    assert body == {
        "error": f"partition {partition}: this instance does not own it",
        "partition": partition,
    }
