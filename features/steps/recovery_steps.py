"""Steps for projections that fail on purpose, on :mod:`foldstream.testing.flaky`: records
whose fold fails a planned number of times in a store, and an outage of the infrastructure as
the fold sees it.

::

    When a record with key "k-1" of "flaky.records" fails in store "flaky" 2 times
    Then folding "k-1" into "flaky" was attempted 3 times
    When a record with key "k-2" of "flaky.records" finds the broker unavailable in store "flaky"
    When the broker is available again
    Then the instance is not ready, saying "projection 'flaky' failed"
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytest_bdd import parsers, then, when

from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess, http
from foldstream.testing.poison_steps import Written, write
from foldstream.testing.steps import wait_until


@pytest.fixture
def attempt_markers(tmp_path: Path) -> Path:
    """Where the flaky projections count their attempts, one file per key and store."""
    return tmp_path


@when(
    parsers.re(
        r'a record with key "(?P<key>[^"]+)" of "(?P<topic>[^"]+)" (?:fails in store '
        r'"(?P<store>[\w-]+)" (?P<times>\d+) times|finds the broker unavailable in store '
        r'"(?P<unavailable_in>[\w-]+)")'
    )
)
def failing_record(
    broker: KafkaCluster,
    attempt_markers: Path,
    written: dict[str, list[Written]],
    key: str,
    topic: str,
    store: str | None,
    times: str | None,
    unavailable_in: str | None,
) -> None:
    """A record whose fold in ``store`` fails ``times`` times, or raises
    :class:`~foldstream.errors.BrokerUnavailable` in ``unavailable_in`` until the broker is
    available again."""
    plan: dict[str, object] = {"marker": str(attempt_markers / key)}
    if store is not None and times is not None:
        plan["fail"] = {store: int(times)}
    if unavailable_in is not None:
        outage = attempt_markers / "outage"
        outage.touch()
        plan["unavailable"] = {unavailable_in: str(outage)}
    write(broker.bootstrap, written, topic, key.encode(), json.dumps(plan).encode())


@when("the broker is available again")
def outage_over(attempt_markers: Path) -> None:
    (attempt_markers / "outage").unlink()


@then(parsers.parse('folding "{key}" into "{store}" was attempted {times:d} times'))
def attempted(attempt_markers: Path, key: str, store: str, times: int) -> None:
    marker = attempt_markers / f"{key}.{store}"
    assert len(marker.read_text().splitlines()) == times


@then(parsers.parse('the instance is not ready, saying "{reason}"'))
def not_ready(instance: InstanceProcess, reason: str) -> None:
    last: dict[str, object] = {}

    def unready_for_reason() -> bool:
        last["answer"] = status, body = http("GET", f"{instance.url}/ready")
        return status == 503 and reason in json.dumps(body)

    wait_until(unready_for_reason, lambda: f"/ready answered {last.get('answer')}")
