"""The step library: Given/When/Then sentences for pytest-bdd features, on real instances.

Loaded by :mod:`foldstream.testing.plugin`; a test module only binds its feature files::

    from pytest_bdd import scenarios

    scenarios("stock.feature")

Steps talk to the ``instance`` fixture (the service under test, or the one a
``Given the service "..." is running`` step chose). JSON in sentences is written as JSON::

    Given product "sku-1" accepted "receive_shipment" with {"quantity": 3}
    Given these events were appended to product "sku-2":
      | type             | data            |
      | ShipmentReceived | {"quantity": 4} |
    When product "sku-1" is sent "sell" with {"quantity": 5}
    Then the command is rejected with status 422 saying "only 3 on hand"
    And nothing was appended
    Then the command appended these events:
      | type              | data            |
      | Product.ItemsSold | {"quantity": 2} |
    Then the store "stock" returns {"on_hand": 1} for "sku-1"
    Then the store "stock" holds a plain fold of its topic

The other sentences: ``Given the topic "t" has 3 partitions``; ``When a "librdkafka"|"java"
producer writes these records to "t":`` (key | value table, empty value = tombstone) and ``Then
every record landed in the partition the "consistent"|"murmur2" partitioner gives its key``;
``When another writer keeps appending "cmd" with {...} to each of 40 product ids starting
"p-"`` (or ``to 20 at random of 3000 product ids starting "p-"``: 20 drawn each round),
``When the store "s" has a value for "k"``, ``When the instance is killed while the writer is
still appending``, ``When the writer appends 50 more rounds and stops``, ``When the
instance is restarted``; ``Then looking up "k" in store "s" answers 404 saying "..."``, ``Then
GET "/path" answers 200 with {...}``, ``Then the instance becomes ready``, ``Then the changelog
of store "s" holds the served value of every key``.

Every waiting step waits for a condition (at most ``WAIT`` seconds), never for a fixed time.

Sentences about clusters of instances (``Given a cluster of 3 instances of the service``,
routing, standby reads, ``kill -9`` of an owner under query load, restarts with lost state) are
in :mod:`foldstream.testing.cluster_steps`, loaded by the plugin too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.client import HTTPException
from typing import Any

import pytest
from confluent_kafka import Producer
from pytest_bdd import given, parsers, then, when
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from foldstream import process
from foldstream.broker import EmbeddedBroker
from foldstream.changelog import EPOCH_HEADER, SOURCE_OFFSET_HEADER
from foldstream.domain import Aggregate
from foldstream.kafka import (
    Partitioner,
    TopicSpec,
    ensure_topics,
    partition_for,
    producer_config,
    read_to_end,
    topic_partitions,
)
from foldstream.kafka_client import admin_client, client_config
from foldstream.process import InstanceProcess, http
from foldstream.projections import Projection
from foldstream.projections.reference import fold_topic
from foldstream.service import Service, load_service
from foldstream.settings import Settings
from foldstream.testing.kafka import (
    CommandWriter,
    append_events,
    kafka_python_config,
    log_ends,
    records_at,
)
from foldstream.testing.plugin import InstancePool
from foldstream.times import to_epoch_ms

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


# Given ---------------------------------------------------------------------------------------


@given(parsers.parse('the service "{service}" is running'), target_fixture="instance")
def the_service_is_running(instances: InstancePool, service: str) -> InstanceProcess:
    return instances.get(service)


@given(parsers.parse('the service "{service}" is running on {server}'), target_fixture="instance")
def the_service_is_running_on(
    instances: InstancePool, service: str, server: str
) -> InstanceProcess:
    """``server`` is the HTTP server of ``foldstream serve --server``: uvicorn or granian."""
    return instances.get(service, server)


@given(parsers.parse('the topic "{topic}" has {partitions:d} partitions'))
def the_topic_exists(broker: EmbeddedBroker, topic: str, partitions: int) -> None:
    ensure_topics(broker.bootstrap, [TopicSpec(topic, partitions)])


@given(
    parsers.re(
        rf'(?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)" accepted "(?P<command>{NAME})" '
        r"with (?P<arguments>.+)"
    )
)
def command_accepted(
    instance: InstanceProcess, aggregate: str, aggregate_id: str, command: str, arguments: str
) -> None:
    status, body = http(
        "POST",
        f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}",
        json.loads(arguments),
    )
    assert status == 200, body


_APPENDED = (
    rf'these events were appended to (?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)"'
    r'(?: in the partition of "(?P<beside>[^"]+)")?:'
)


@given(parsers.re(_APPENDED))
@when(parsers.re(_APPENDED))
def events_appended(
    instance: InstanceProcess,
    aggregate: str,
    aggregate_id: str,
    beside: str | None,
    datatable: list[list[str]],
) -> None:
    """A new aggregate's events (its Created event first), appended by another producer. A
    ``timestamp`` column (ISO-8601) sets the events' times (the Created event takes the first
    row's). ``in the partition of "k"``: the aggregate's id is ``aggregate_id`` followed by
    ``-<n>``, the first such id in the partition of ``k``."""
    cls = _aggregate_class(instance, aggregate)
    if beside is not None:
        wanted = partition_for(beside.encode(), instance.partitions)
        aggregate_id = next(
            f"{aggregate_id}-{n}"
            for n in range(10_000)
            if partition_for(f"{aggregate_id}-{n}".encode(), instance.partitions) == wanted
        )
    target = cls(id=aggregate_id)  # type: ignore[call-arg]
    rows = _rows(datatable)
    for row in rows:
        event_class = getattr(cls, row["type"], None)
        assert isinstance(event_class, type), f"{cls.__name__} has no event {row['type']!r}"
        arguments = json.loads(row.get("data") or "{}")
        if row.get("timestamp"):
            arguments["timestamp"] = datetime.fromisoformat(row["timestamp"])
        target.trigger_event(event_class, **arguments)
    if rows and rows[0].get("timestamp"):
        created = target.pending_events[0]
        object.__setattr__(created, "timestamp", datetime.fromisoformat(rows[0]["timestamp"]))
    _, settings = service_of(instance)
    producer = Producer(producer_config(instance.bootstrap))
    append_events(producer, settings.events_topic, target.collect_events())
    assert producer.flush(30) == 0


def _rows(datatable: list[list[str]]) -> list[dict[str, str]]:
    header, *rows = datatable
    return [dict(zip(header, row, strict=True)) for row in rows]


# When ----------------------------------------------------------------------------------------

#: How long a command answered 503 (its partition still replayed or moving) is sent again.
COMMAND_RETRY_S = 60.0


@when(
    parsers.re(
        rf'(?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)" is sent "(?P<command>{NAME})" '
        r"with (?P<body>.*)"
    )
)
def send_command(
    instance: InstanceProcess,
    scenario_state: ScenarioState,
    aggregate: str,
    aggregate_id: str,
    command: str,
    body: str,
) -> None:
    """Sends ``body`` as it is written (so malformed JSON can be sent too). A 503 (the
    partition is still being replayed or moved) is sent again, as a client does, for up to
    :data:`COMMAND_RETRY_S`; any other answer is the scenario's to check."""
    _, settings = service_of(instance)
    scenario_state.ends_before = log_ends(
        instance.bootstrap, settings.events_topic, instance.partitions
    )
    scenario_state.sent_key = aggregate_id
    url = f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}"
    send = Retrying(
        stop=stop_after_delay(COMMAND_RETRY_S),
        wait=wait_fixed(0.2),
        retry=retry_if_result(lambda answer: answer[0] == 503),
        retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
    )
    scenario_state.response = send(http, "POST", url, body.encode())


@when(parsers.parse('a "{client}" producer writes these records to "{topic}":'))
def produce_records(
    broker: EmbeddedBroker,
    scenario_state: ScenarioState,
    client: str,
    topic: str,
    datatable: list[list[str]],
) -> None:
    """``client`` is ``librdkafka`` (its defaults) or ``java`` (a Java-compatible client,
    kafka-python); an empty ``value`` cell writes a tombstone. A ``timestamp`` column (ISO-8601
    or epoch milliseconds) sets the records' timestamps (else: the producer's clock)."""
    records = [
        (
            r["key"].encode(),
            r["value"].encode() or None,
            to_epoch_ms(r["timestamp"]) if r.get("timestamp") else None,
        )
        for r in _rows(datatable)
    ]
    scenario_state.produced_to = topic
    if client == "librdkafka":
        producer = Producer(client_config(broker.bootstrap))  # librdkafka's defaults

        def delivered(error: Any, message: Any) -> None:
            scenario_state.produced.append((message.key(), message.partition()))

        for key, value, stamp in records:
            producer.produce(
                topic, key=key, value=value, on_delivery=delivered, timestamp=stamp or 0
            )
        assert producer.flush(30) == 0
    elif client == "java":
        try:
            import kafka
        except ImportError:
            pytest.fail("a 'java' producer needs kafka-python: pip install kafka-python")
        java = kafka.KafkaProducer(**kafka_python_config(broker.bootstrap))
        futures = [
            (key, java.send(topic, key=key, value=value, timestamp_ms=stamp))
            for key, value, stamp in records
        ]
        java.flush()
        scenario_state.produced += [(k, f.get(timeout=10).partition) for k, f in futures]
        java.close()
    else:
        pytest.fail(f"unknown producer {client!r}: use 'librdkafka' or 'java'")
    assert len(scenario_state.produced) == len(records)


@when(
    parsers.re(
        r'another writer keeps appending "(?P<command>[\w-]+)" with (?P<arguments>\{.*\}) '
        r"to (?:each of|(?P<per_round>\d+) at random of) "
        rf'(?P<count>\d+) (?P<aggregate>{NAME}) ids starting "(?P<prefix>[^"]+)"'
    )
)
def another_writer(
    instance: InstanceProcess,
    scenario_state: ScenarioState,
    command: str,
    arguments: str,
    per_round: str | None,
    count: str,
    aggregate: str,
    prefix: str,
) -> None:
    """Starts a :class:`CommandWriter` on ids ``<prefix>0`` to ``<prefix><count - 1>``, each
    round on all of them or on ``per_round`` drawn at random."""
    cls = _aggregate_class(instance, aggregate)
    _, settings = service_of(instance)
    scenario_state.writer = CommandWriter(
        bootstrap=instance.bootstrap,
        topic=settings.events_topic,
        aggregates=[cls(id=f"{prefix}{n}") for n in range(int(count))],  # type: ignore[call-arg]
        command=command,
        arguments=json.loads(arguments),
        per_round=None if per_round is None else int(per_round),
    ).start()


@when("the instance is killed while the writer is still appending")
def kill_mid_stream(instance: InstanceProcess, scenario_state: ScenarioState) -> None:
    """SIGKILL the instance's process group (the JVM and Spark's workers with it)."""
    assert scenario_state.writer is not None, "no writer was started"
    assert scenario_state.writer.is_alive(), f"the writer stopped: {scenario_state.writer.error}"
    instance.kill()


@when(parsers.parse("the writer appends {rounds:d} more rounds and stops"))
def writer_stops(scenario_state: ScenarioState, rounds: int) -> None:
    assert scenario_state.writer is not None, "no writer was started"
    scenario_state.writer.stop_after(rounds)


@when("the instance is restarted")
def restart(instance: InstanceProcess) -> None:
    instance.start()
    instance.wait_ready()


@when("the instance's own process is killed with kill -9")
def kill_server_process(instance: InstanceProcess) -> None:
    """SIGKILL the ``foldstream serve`` process alone (not its process group)."""
    assert instance.process is not None, "the instance is not running"
    instance.process.kill()
    instance.process.wait()


@then("nothing of the instance answers any more")
def instance_gone(instance: InstanceProcess) -> None:
    """No orphan (e.g. an HTTP server's worker process) goes on serving the instance's port."""

    def gone() -> bool:
        try:
            http("GET", f"{instance.url}/health")
        except REQUEST_ERRORS:
            return True
        return False

    wait_until(gone, lambda: f"{instance.url} still answers after its process was killed")


# Then ----------------------------------------------------------------------------------------


@then("the command appended these events:")
def command_appended(
    instance: InstanceProcess, scenario_state: ScenarioState, datatable: list[list[str]]
) -> None:
    """The answer lists the events, and Kafka holds them at the answered position, in the
    partition of the aggregate's key."""
    status, body = scenario_state.last_response()
    assert status == 200, body
    expected = [(r["type"], json.loads(r.get("data") or "{}")) for r in _rows(datatable)]
    answered = [
        (e["type"], {k: v for k, v in e.items() if k not in ("type", "version")})
        for e in body["events"]
    ]
    assert answered == expected
    partition, last = body["position"]["partition"], body["position"]["offset"]
    key = scenario_state.sent_key.encode()
    assert partition == partition_for(key, instance.partitions)
    definition, settings = service_of(instance)
    first = last - len(expected) + 1
    assert first == scenario_state.ends_before[partition], "other records landed in between"
    codec = definition.codec
    stored = records_at(instance.bootstrap, settings.events_topic, partition, first, last)
    decoded = [codec.decode(record) for record in stored]
    assert [r.key for r in stored] == [key] * len(expected)
    assert [type(e).__qualname__ for e in decoded] == [t for t, _ in expected]
    assert [e.originator_version for e in decoded] == [e["version"] for e in body["events"]]


@then(parsers.parse('the command is rejected with status {status:d} saying "{reason}"'))
def rejected(scenario_state: ScenarioState, status: int, reason: str) -> None:
    got_status, body = scenario_state.last_response()
    assert got_status == status, body
    assert reason in body["error"], body


@then("nothing was appended")
def nothing_appended(instance: InstanceProcess, scenario_state: ScenarioState) -> None:
    """The events topic ends where it ended before the command (a command answers only after
    its events are acknowledged, so an append would be visible already)."""
    _, settings = service_of(instance)
    after = log_ends(instance.bootstrap, settings.events_topic, instance.partitions)
    assert after == scenario_state.ends_before


@then(parsers.parse('the store "{store}" returns {value} for "{key}"'))
def store_returns(instance: InstanceProcess, store: str, value: str, key: str) -> None:
    expected = (200, {"key": key, "value": json.loads(value)})
    last: dict[str, tuple[int, Any]] = {}

    def served() -> bool:
        last["answer"] = lookup(instance, store, key)
        return last["answer"] == expected

    wait_until(
        served,
        lambda: (
            f"{store}/{key} answered {last['answer']}, wanted {expected}; "
            f"/ready: {http('GET', f'{instance.url}/ready')}"
        ),
    )


@when(parsers.parse('the store "{store}" has a value for "{key}"'))
@then(parsers.parse('the store "{store}" has a value for "{key}"'))
def store_has_value(instance: InstanceProcess, store: str, key: str) -> None:
    wait_until(lambda: lookup(instance, store, key)[0] == 200, lambda: f"no {key!r} in {store}")


@then(parsers.parse('looking up "{key}" in store "{store}" answers {status:d} saying "{reason}"'))
def lookup_fails(instance: InstanceProcess, key: str, store: str, status: int, reason: str) -> None:
    got_status, body = lookup(instance, store, key)
    assert got_status == status, body
    assert reason in body["error"], body


@then("the instance becomes ready")
def becomes_ready(instance: InstanceProcess) -> None:
    """``GET /ready`` answers 200: every store has caught up with its topic."""
    instance.wait_ready(timeout=WAIT)


@then(parsers.parse('GET "{path}" answers {status:d} with {body}'))
def get_answers_with(instance: InstanceProcess, path: str, status: int, body: str) -> None:
    assert http("GET", f"{instance.url}{path}") == (status, json.loads(body))


@then(parsers.parse('the store "{store}" holds a plain fold of its topic'))
def store_is_plain_fold(instance: InstanceProcess, store: str) -> None:
    """Every key of the topic is served with the value a plain-Python fold of the whole topic
    gives, and deleted keys answer 404: nothing lost, nothing applied twice. (An ordered or
    windowed store: every key's range or windows, :mod:`foldstream.testing.ordered_steps`.)"""
    projection, topic, partitions = _source(instance, store)
    if projection.kind != "point":
        from foldstream.testing.ordered_steps import plain_fold_served

        plain_fold_served(instance, store, "range" if projection.kind == "ordered" else "windows")
        return
    # A key that is not UTF-8 (another producer's raw record) cannot be asked for over HTTP,
    # which answers such keys 400: the comparison is over the keys a client can look up.
    expected = {
        key: value
        for key, value in fold_topic(instance.bootstrap, projection, topic, partitions).items()
        if "\ufffd" not in key
    }
    assert expected, f"{topic} holds nothing to compare with"
    served: dict[str, Any] = {}

    def all_served() -> bool:
        for key in expected:
            status, body = lookup(instance, store, key)
            served[key] = body["value"] if status == 200 else None
        return served == expected

    wait_until(
        all_served,
        lambda: "; ".join(
            f"{k}: served {served[k]}, fold {v}" for k, v in expected.items() if served[k] != v
        ),
    )


@then(parsers.parse('the changelog of store "{store}" holds the served value of every key'))
def changelog_matches(instance: InstanceProcess, store: str) -> None:
    """The compacted changelog's latest value per key, in the key's partition and stamped with
    its source offset and its writer's epoch, is what the store serves."""
    projection, _, partitions = _source(instance, store)
    _, settings = service_of(instance)
    changelog = settings.changelog_topic(store)
    mismatched: list[str] = []

    def consistent() -> bool:
        latest: dict[bytes, bytes | None] = {}
        for batch in read_to_end(instance.bootstrap, changelog, partitions):
            for message in batch:
                key = message.key()
                assert message.partition() == partition_for(key, partitions, projection.partitioner)
                headers = dict(message.headers() or ())
                assert SOURCE_OFFSET_HEADER in headers
                assert int(headers[EPOCH_HEADER]) >= 1
                latest[key] = message.value()
        assert latest, f"{changelog} is empty"
        mismatched.clear()
        for key, value in latest.items():
            status, body = lookup(instance, store, key.decode())
            served = body["value"] if status == 200 else None
            if served != (None if value is None else json.loads(value)):
                mismatched.append(f"{key!r}: changelog {value!r}, served {served!r}")
        return not mismatched

    wait_until(consistent, lambda: "; ".join(mismatched))


@then(
    parsers.parse(
        'every record landed in the partition the "{partitioner}" partitioner gives its key'
    )
)
def landed_by_partitioner(
    broker: EmbeddedBroker, scenario_state: ScenarioState, partitioner: Partitioner
) -> None:
    assert scenario_state.produced, "no records were produced in this scenario"
    partitions = topic_partitions(admin_client(broker.bootstrap), scenario_state.produced_to)
    assert partitions, f"topic {scenario_state.produced_to!r} does not exist"
    wrong = [
        (key, partition)
        for key, partition in scenario_state.produced
        if partition != partition_for(key, partitions, partitioner)
    ]
    assert not wrong, f"{partitioner} puts these keys elsewhere: {wrong}"
