"""Hostile command requests get a 4xx JSON answer, append nothing, and leave the partition's
writer and every other command alone (a real broker and uvicorn, no Spark)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from foldstream import kafka_client
from foldstream.broker import KafkaCluster
from foldstream.commands import CommandHandler
from foldstream.commands.http import command_routes
from foldstream.domain import Aggregate, command, event
from foldstream.examples.inventory import service
from foldstream.http_input import InputLimits
from foldstream.instance import event_bytes_limit
from foldstream.routing import Local, Location, MaxLag, Redirect
from foldstream.testing.asgi import uvicorn_thread
from tests.test_command_ownership import PARTITIONS, events_in, handlers, key_in, new_topic


class Served:
    """The command routes of one handler owning every partition, on a real uvicorn."""

    def __init__(self, url: str, handler: CommandHandler, broker: KafkaCluster) -> None:
        self.url, self.handler, self.broker = url, handler, broker

    def send(
        self, path: str, body: bytes | Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        """POST ``body`` (bytes as they are, an iterable of bytes chunked, else JSON)."""
        status, headers, payload = self.send_raw(path, body, headers)
        return status, headers, json.loads(payload or b"null")

    def send_raw(
        self, path: str, body: bytes | Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """:meth:`send`, answering the body's bytes as they came."""
        address = urllib.parse.urlsplit(self.url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        chunked = body is not None and not isinstance(body, bytes | dict)
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        try:
            connection.request("POST", path, data, headers or {}, encode_chunked=chunked)
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        return response.status, dict(response.getheaders()), payload

    def appended(self) -> int:
        return sum(len(events_in(self.broker, self.handler.topic, p)) for p in range(PARTITIONS))


class Notebook(Aggregate):
    """Takes notes of any length: a command whose event may outgrow a Kafka record."""

    def __init__(self, id: str) -> None:  # noqa: A002 - eventsourcing's name for the id
        pass

    @command
    def write(self, text: str) -> None:
        self._written(text)

    @event("Written")
    def _written(self, text: str) -> None:
        pass


# A body limit raised so that a 1.1 MB note reaches the handler: the record-size check must
# stop it there.
_WIDE = InputLimits(max_body_bytes=4_000_000)


@pytest.fixture(scope="module")
def served(broker: KafkaCluster) -> Iterator[tuple[Served, Served]]:
    """The same handler behind the default limits and behind wide ones."""
    aggregates = {**service.aggregates, "notebook": Notebook}
    with handlers(broker, new_topic(broker), 1, aggregates=aggregates) as (handler,):
        handler.assign(range(PARTITIONS))

        def routes(limits: InputLimits) -> Starlette:
            return Starlette(routes=command_routes(lambda: handler, Everywhere, limits=limits))

        with uvicorn_thread(routes(InputLimits())) as url, uvicorn_thread(routes(_WIDE)) as wide:
            yield Served(url, handler, broker), Served(wide, handler, broker)


class Everywhere:
    """Every partition's commands are answered here."""

    def locate(self, topic: str, partition: int, *, max_lag: MaxLag = None) -> Location:
        return Local(partition, "active", None, "here")


def test_an_event_too_large_for_the_producer_is_413_and_nothing_else_fails(
    served: tuple[Served, Served],
) -> None:
    """Before, an event over the producer's message size (a 1.1 MB aggregate id, or note)
    failed the partition's transaction: its writer was released and every command queued
    beside it got 503."""
    _, wide = served
    handler = wide.handler
    partition = handler.partition_of("huge")
    small = [key_in(handler, partition, f"beside-{n}-") for n in range(8)]
    before = wide.appended()

    def send(key: str) -> tuple[int, dict[str, str], Any]:
        text = "t" * (1_100_000 if key == "huge" else 10)
        return wide.send(f"/commands/notebook/{key}/write", {"text": text})

    with ThreadPoolExecutor(max_workers=9) as pool:
        answers = list(pool.map(send, [*small[:4], "huge", *small[4:]]))
    status, _, body = answers.pop(4)
    assert status == 413 and "at most" in body["error"], body
    assert [a[0] for a in answers] == [200] * 8, answers
    assert partition in handler.owned()
    assert wide.appended() == before + 8 * 2  # Created + Written each
    assert send(small[0])[0] == 200


def _number(digits: str) -> bytes:
    return b'{"quantity": ' + digits.encode() + b"}"


def _nested(depth: int) -> bytes:
    return b'{"quantity": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "says"),
    [
        ("/commands/product/x/sell?expected_version=" + "9" * 5000, {}, {}, 400, "expected_"),
        ("/commands/product/x/sell", {}, {"If-Match": "9" * 5000}, 400, "If-Match"),
        ("/commands/product/x/sell", {}, {"If-Match": str(2**63)}, 400, "If-Match"),
        ("/commands/product/x/sell?hops=" + "9" * 5000, {}, {}, 400, "hops"),
        ("/commands/product/x/receive_shipment", _nested(100_000), {}, 400, "malformed JSON"),
        ("/commands/product/x/receive_shipment", _nested(40), {}, 400, "nested"),
        ("/commands/product/x/receive_shipment", b'{"quantity": 1e999}', {}, 400, "too large"),
        ("/commands/product/x/receive_shipment", b'{"quantity": NaN}', {}, 400, "NaN"),
        ("/commands/product/x/receive_shipment", {"quantity": 2**63}, {}, 400, "2**63"),
        ("/commands/product/x/receive_shipment", _number("9" * 5000), {}, 400, "outside"),
        ("/commands/product/x/receive_shipment", _number("-" + "9" * 30), {}, 400, "outside"),
        ("/commands/product/x/receive_shipment", b" " * (1024 * 1024 + 1), {}, 413, "at most"),
        ("/commands/product/x/receive_shipment", iter([b" " * 65536] * 17), {}, 413, "at most"),
        ("/commands/product/%FF/receive_shipment", {"quantity": 1}, {}, 400, "UTF-8"),
        ("/commands/product/" + "i" * 5000 + "/sell", {"quantity": 1}, {}, 400, "at most"),
        ("/commands/product/x/" + "c" * 300, {}, {}, 400, "at most"),
        ("/commands/%FE/x/sell", {"quantity": 1}, {}, 400, "UTF-8"),
        ("/commands/product/x/sell?y=" + "z" * 9000, {}, {}, 414, "URL"),
        ("/commands/product/x/receive_shipment", b"\xff\xfe{}", {}, 400, "malformed"),
    ],
    ids=lambda v: repr(v)[:50] if isinstance(v, str | bytes) else None,
)
def test_a_hostile_command_is_4xx_appends_nothing_and_harms_nothing(
    served: tuple[Served, Served],
    path: str,
    body: Any,
    headers: dict[str, str],
    status: int,
    says: str,
) -> None:
    plain, _ = served
    before = plain.appended()
    got, _, answer = plain.send(path, body, headers)
    assert got == status and says in answer["error"], (got, answer)
    assert plain.appended() == before
    assert plain.handler.owned() == frozenset(range(PARTITIONS))
    for partition in range(PARTITIONS):  # every partition still takes commands
        key = key_in(plain.handler, partition, "after-")
        got, _, answer = plain.send(f"/commands/product/{key}/receive_shipment", {"quantity": 1})
        assert got == 200, answer


def test_an_accepted_commands_answer_is_the_json_response_of_its_fields(
    served: tuple[Served, Served],
) -> None:
    """The 200 is rendered as Starlette's JSONResponse renders the same fields: the same bytes
    (non-ASCII text as UTF-8, compact separators) and the same content type."""
    plain, _ = served
    status, headers, body = plain.send_raw(
        "/commands/notebook/n-1/write", {"text": 'café ✓ \u2028 "quoted"'}
    )
    assert status == 200, body
    fields = json.loads(body)
    assert [e["text"] for e in fields["events"] if "text" in e] == ['café ✓ \u2028 "quoted"']
    assert body == JSONResponse(fields).body
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)


def test_a_redirect_with_a_huge_hop_count_is_400(broker: KafkaCluster) -> None:
    class Elsewhere:
        def locate(self, topic: str, partition: int, *, max_lag: MaxLag = None) -> Location:
            return Redirect(partition, "http://127.0.0.1:9")

    with handlers(broker, new_topic(broker), 1) as (handler,):
        app = Starlette(routes=command_routes(lambda: handler, Elsewhere))
        with uvicorn_thread(app) as url:
            web = Served(url, handler, broker)
            status, _, body = web.send("/commands/product/x/sell?hops=" + "9" * 5000, {})
            assert status == 400 and "hops must be a non-negative integer" in body["error"]
            status, headers, _ = web.send("/commands/product/x/sell?hops=1", {})
            assert status == 307
            assert headers["location"] == "http://127.0.0.1:9/commands/product/x/sell?hops=2"


def test_the_event_limit_follows_a_lower_message_max_bytes() -> None:
    before = kafka_client.installed()
    try:
        kafka_client.install({**before, "message.max.bytes": "500000"})
        assert event_bytes_limit(InputLimits()) == 500_000 - 1_024
        kafka_client.install({**before, "message.max.bytes": "5000000"})  # raise both together
        assert event_bytes_limit(InputLimits()) == InputLimits().max_event_bytes
    finally:
        kafka_client.install(before)
