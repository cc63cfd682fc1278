"""Step definitions for commands_and_queries.feature, on a real running instance."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.process import InstanceProcess, http, lookup

scenarios("commands_and_queries.feature")


@pytest.fixture
def last_response() -> dict[str, Any]:
    return {}


def _send(instance: InstanceProcess, command: str, quantity: int, sku: str) -> tuple[int, Any]:
    return http("POST", f"{instance.url}/commands/product/{sku}/{command}", {"quantity": quantity})


@given(parsers.parse('product "{sku}" has received {quantity:d} items'))
def product_received(inventory: InstanceProcess, sku: str, quantity: int) -> None:
    status, body = _send(inventory, "receive_shipment", quantity, sku)
    assert status == 200, body


@when(parsers.parse('I send "{command}" with quantity {quantity:d} to product "{sku}"'))
def send_command(
    inventory: InstanceProcess, last_response: dict[str, Any], command: str, quantity: int, sku: str
) -> None:
    last_response["status"], last_response["body"] = _send(inventory, command, quantity, sku)


@then(parsers.parse('the command is rejected with status {status:d} saying "{reason}"'))
def rejected(last_response: dict[str, Any], status: int, reason: str) -> None:
    assert last_response["status"] == status
    assert reason in last_response["body"]["error"]


@then(parsers.parse('the store "{store}" returns {value} for "{key}"'))
def store_returns(inventory: InstanceProcess, store: str, value: str, key: str) -> None:
    expected = json.loads(value)
    deadline = time.monotonic() + 90  # first batches are slow on a busy machine
    while (got := lookup(inventory.url, store, key)) != (
        200,
        {"key": key, "value": expected},
    ):
        assert time.monotonic() < deadline, got
        time.sleep(0.02)


@then(parsers.parse('looking up "{key}" in store "{store}" answers {status:d}'))
def lookup_status(inventory: InstanceProcess, key: str, store: str, status: int) -> None:
    assert http("GET", f"{inventory.url}/stores/{store}/keys/{key}")[0] == status
