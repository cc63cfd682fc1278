"""The inventory service through HTTP: commands, queries, errors and the changelog."""

from __future__ import annotations

import json
import time

import pytest

from foldstream.broker import EmbeddedBroker
from foldstream.kafka import partition_for
from foldstream.offsets import EndOffsets
from foldstream.process import InstanceProcess, http
from tests.kafka_reading import read_topic

EVENTS = "inventory.events"


def command(instance: InstanceProcess, sku: str, name: str, body: object) -> tuple[int, object]:
    return http("POST", f"{instance.url}/commands/product/{sku}/{name}", body)


def wait_for_value(instance: InstanceProcess, store: str, key: str, expected: object) -> None:
    deadline = time.monotonic() + 90  # first batches are slow on a busy machine
    while True:
        status, body = http("GET", f"{instance.url}/stores/{store}/keys/{key}")
        if status == 200 and body["value"] == expected:
            return
        assert time.monotonic() < deadline, f"{store}/{key}: {status} {body}, wanted {expected}"
        time.sleep(0.02)


def test_command_then_query_round_trip(inventory: InstanceProcess) -> None:
    status, body = command(inventory, "round-1", "receive_shipment", {"quantity": 10})
    assert status == 200, body
    assert [e["type"] for e in body["events"]] == ["Product.Created", "Product.ShipmentReceived"]
    assert body["position"]["partition"] == partition_for(b"round-1", 4)
    status, body = command(inventory, "round-1", "sell", {"quantity": 4})
    assert status == 200, body
    assert body["events"] == [{"type": "Product.ItemsSold", "version": 3, "quantity": 4}]
    wait_for_value(inventory, "stock", "round-1", {"on_hand": 6})


def test_queries_list_stores_and_report_errors(inventory: InstanceProcess) -> None:
    assert http("GET", f"{inventory.url}/stores") == (
        200,
        {"stores": [{"name": "stock", "partitions": 4, "partitioner": "murmur2"}]},
    )
    status, body = http("GET", f"{inventory.url}/stores/nope/keys/x")
    assert status == 404 and "no store named 'nope'" in body["error"]
    status, body = http("GET", f"{inventory.url}/stores/stock/keys/never-seen")
    assert status == 404 and "never-seen" in body["error"]
    assert http("GET", f"{inventory.url}/health") == (200, {"status": "alive"})
    status, body = http("GET", f"{inventory.url}/ready")
    assert status == 200 and body["ready"] is True


@pytest.mark.parametrize(
    ("path", "payload", "status", "message"),
    [
        ("product/bad-1/sell", {"quantity": 5}, 422, "only 0 on hand"),
        ("product/bad-1/receive_shipment", {"quantity": 0}, 422, "at least one item"),
        ("product/bad-1/launch", {}, 404, "no command 'launch'"),
        ("warehouse/bad-1/sell", {"quantity": 1}, 404, "no aggregate 'warehouse'"),
        ("product/bad-1/sell", b"{not json", 400, "malformed JSON"),
        ("product/bad-1/sell", [1], 400, "JSON object"),
        ("product/bad-1/sell", {"qty": 1}, 400, "qty"),
        ("product/bad-1/sell", {"quantity": "two"}, 400, "must be int"),
        ("product/bad-1/sell", {"quantity": True}, 400, "must be int"),
        ("product/bad-1/sell", {}, 400, "quantity"),
    ],
)
def test_bad_commands_get_their_4xx_and_append_nothing(
    broker: EmbeddedBroker,
    inventory: InstanceProcess,
    path: str,
    payload: object,
    status: int,
    message: str,
) -> None:
    ends = EndOffsets(broker.bootstrap, EVENTS, list(range(4)))
    try:
        before = ends.ends()
        got = http("POST", f"{inventory.url}/commands/{path}", payload)
        assert got[0] == status, got
        assert message in got[1]["error"]  # type: ignore[index]
        # A valid command on the same key lands right where the log ended: nothing in between.
        ok_status, ok = command(inventory, "bad-1", "receive_shipment", {"quantity": 1})
        assert ok_status == 200, ok
        partition = ok["position"]["partition"]
        first_offset = ok["position"]["offset"] - len(ok["events"]) + 1
        assert first_offset == before[partition]
        after = ends.wait_beyond({partition: before[partition]}, timeout=10)
        assert {p: e for p, e in after.items() if p != partition} == {
            p: e for p, e in before.items() if p != partition
        }
    finally:
        ends.close()


def test_changelog_holds_the_latest_value_of_every_key(
    broker: EmbeddedBroker, inventory: InstanceProcess
) -> None:
    for n in range(20):
        assert command(inventory, f"log-{n}", "receive_shipment", {"quantity": n + 1})[0] == 200
    assert command(inventory, "log-0", "sell", {"quantity": 1})[0] == 200
    wait_for_value(inventory, "stock", "log-0", {"on_hand": 0})
    for n in range(1, 20):
        wait_for_value(inventory, "stock", f"log-{n}", {"on_hand": n + 1})
    latest: dict[bytes, bytes | None] = {}
    for partition, _, key, value, headers in read_topic(
        broker.bootstrap, "inventory.stock.changelog", 4
    ):
        assert partition == partition_for(key, 4)
        assert any(name == "foldstream-source-offset" for name, _ in headers)
        latest[key] = value
    for key, value in latest.items():
        status, body = http("GET", f"{inventory.url}/stores/stock/keys/{key.decode()}")
        assert status == 200 and json.loads(value or b"null") == body["value"]
    assert {f"log-{n}".encode() for n in range(20)} <= set(latest)
