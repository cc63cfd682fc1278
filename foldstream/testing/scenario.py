"""What the step library's sentences share: the scenario's state (:class:`ScenarioState`), waiting
for a condition (:func:`wait_until`), the service under test and its stores, lookups.

Every waiting step waits for a condition (at most :data:`WAIT` seconds), never for a fixed time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any

import pytest

from foldstream import process
from foldstream.domain import Aggregate
from foldstream.kafka import topic_partitions
from foldstream.kafka_client import admin_client
from foldstream.process import InstanceProcess
from foldstream.projections import Projection
from foldstream.service import Service, load_service
from foldstream.settings import Settings
from foldstream.testing.kafka import CommandWriter

#: What a request to an instance that is down (or going down) raises.
REQUEST_ERRORS = (OSError, HTTPException)
WAIT = 120.0  # generous: the first micro-batch after a start is slow on a loaded machine
NAME = r"[\w-]+"


@dataclass
class ScenarioState:
    """What one scenario's steps leave for the next ones."""

    response: tuple[int, Any] | None = None
    ends_before: dict[int, int] = field(default_factory=dict)
    sent_key: str = ""
    produced: list[tuple[bytes, int]] = field(default_factory=list)
    produced_to: str = ""
    writer: CommandWriter | None = None
    #: The first 200 answer of each Idempotency-Key sent, and whether the last answer was a
    #: retry's (``Idempotent-Replayed``).
    first_by_key: dict[str, tuple[int, Any]] = field(default_factory=dict)
    replayed: bool = False

    def last_response(self) -> tuple[int, Any]:
        assert self.response is not None, "no command was sent in this scenario"
        return self.response


@pytest.fixture
def scenario_state() -> Iterator[ScenarioState]:
    state = ScenarioState()
    yield state
    if state.writer is not None and state.writer.is_alive():  # the scenario failed half-way
        state.writer.stop_after(0)


def wait_until(check: Callable[[], Any], describe: Callable[[], str], timeout: float = WAIT) -> Any:
    """Poll ``check`` until it returns something truthy, or fail with ``describe()``."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {describe()}")
        time.sleep(0.02)
    return result


def service_of(instance: InstanceProcess) -> tuple[Service, Settings]:
    definition = load_service(instance.service)
    return definition, Settings(service=definition.name, partitions=instance.partitions)


def _aggregate_class(instance: InstanceProcess, aggregate: str) -> type[Aggregate]:
    definition, _ = service_of(instance)
    try:
        return definition.aggregates[aggregate]
    except KeyError:
        pytest.fail(
            f"no aggregate {aggregate!r} in {definition.name}: {sorted(definition.aggregates)}"
        )


def _source(instance: InstanceProcess, store: str) -> tuple[Projection, str, int]:
    """The projection of ``store``, the topic it folds and that topic's partition count."""
    definition, settings = service_of(instance)
    projection = definition.projection(store)
    topic = projection.source_topic(settings.events_topic)
    partitions = topic_partitions(admin_client(instance.bootstrap), topic)
    assert partitions, f"topic {topic!r} of store {store!r} does not exist"
    return projection, topic, partitions


def lookup(instance: InstanceProcess, store: str, key: str) -> tuple[int, Any]:
    """The answer to a lookup (redirects followed), without who served it."""
    return process.lookup(instance.url, store, key)


def _rows(datatable: list[list[str]]) -> list[dict[str, str]]:
    header, *rows = datatable
    return [dict(zip(header, row, strict=True)) for row in rows]
