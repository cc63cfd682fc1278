"""Steps for projections recovering from failed micro-batches, on :mod:`foldstream.testing.flaky`.

::

    When a record with key "k-1" of "flaky.records" fails its projection 2 times
    Then folding "k-1" was attempted 3 times
    Then the instance is not ready, saying "projection 'flaky' failed"
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pytest_bdd import parsers, then, when

from foldstream.broker import EmbeddedBroker
from foldstream.kafka import producer_config
from foldstream.process import InstanceProcess, http
from foldstream.testing.steps import wait_until


@pytest.fixture
def attempt_markers(tmp_path: Path) -> Path:
    """Where the flaky projection counts its attempts, one file per key."""
    return tmp_path


@when(parsers.parse('a record with key "{key}" of "{topic}" fails its projection {times:d} times'))
def failing_record(
    broker: EmbeddedBroker, attempt_markers: Path, key: str, topic: str, times: int
) -> None:
    plan = {"fail_times": times, "marker": str(attempt_markers / f"{key}.attempts")}
    producer = Producer(producer_config(broker.bootstrap))
    producer.produce(topic, key=key.encode(), value=json.dumps(plan).encode())
    assert producer.flush(30) == 0


@then(parsers.parse('folding "{key}" was attempted {times:d} times'))
def attempted(attempt_markers: Path, key: str, times: int) -> None:
    marker = attempt_markers / f"{key}.attempts"
    assert len(marker.read_text().splitlines()) == times


@then(parsers.parse('the instance is not ready, saying "{reason}"'))
def not_ready(instance: InstanceProcess, reason: str) -> None:
    last: dict[str, object] = {}

    def unready_for_reason() -> bool:
        last["answer"] = status, body = http("GET", f"{instance.url}/ready")
        return status == 503 and reason in json.dumps(body)

    wait_until(unready_for_reason, lambda: f"/ready answered {last.get('answer')}")
