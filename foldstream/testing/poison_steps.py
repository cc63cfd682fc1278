"""Steps for poison records: records written raw to a topic, and what the stores' policies
made of them (dead-letter topics, ``/metrics``, ``/ready``). The command side's replay of them:
:mod:`foldstream.testing.replay_steps`.

::

    When a "garbage" record with key "junk-1" is written to the events topic
    When another producer appends two "ShipmentReceived" events with a 4300-digit "quantity"
      to product "big"                                                   (one line)
    When a record with key "note-1" of "notes.topic" has the value {"text": "hi"}
    When a record without a key is written to "notes.topic"
    When a record with key "deep" of "notes.topic" holds JSON nested 100000 levels deep
    Then store "stock" dead-lettered the record with key "junk-1" saying "not a foldstream event"
    Then store "notes" dead-lettered the record without a key saying "without a key"
    Then nothing was dead-lettered for "k" by store "stock"
    Then its metrics count 1 more record of store "stock" dead-lettered
    Then commands on every partition still fold into store "stock"
    Then /ready names the partition of "k" in store "s" stopped at its offset, saying "failing"

Record kinds written to the events topic: ``garbage`` (bytes, no headers), ``headerless`` (an
event's JSON, no headers), ``os-system`` (``event-type: os:system``), ``foreign-module`` (the
type of a class in a module the service does not define), ``huge-number`` (an event of the
service whose JSON holds a 5000-digit integer), ``forged-creation`` (a created event naming
``os:system`` as its aggregate's class).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer
from pytest_bdd import given, parsers, then, when

from foldstream.broker import KafkaCluster
from foldstream.kafka import partition_for, producer_config, read_to_end, topic_partitions
from foldstream.kafka_client import admin_client
from foldstream.process import InstanceProcess, http
from foldstream.projections.poison import (
    DLQ_ERROR_HEADER,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_STORE_HEADER,
    DLQ_TOPIC_HEADER,
)
from foldstream.scrape import Samples, scrape
from foldstream.testing.steps import (
    WAIT,
    _aggregate_class,
    service_of,
    store_has_value,
    wait_until,
)

NO_KEY = "<no key>"
HUGE = int("9" * 4300)  # the most digits Python turns into a string


@dataclass(frozen=True)
class Written:
    """A record a step wrote, and where it landed."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


@pytest.fixture
def written() -> dict[str, list[Written]]:
    """The records this scenario's steps wrote, by key (:data:`NO_KEY` for none)."""
    return {}


def write(
    bootstrap: str,
    written: dict[str, list[Written]],
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]] | None = None,
) -> Written:
    """Produce one record (murmur2 partitioning by key) and remember where it landed."""
    landed: list[Any] = []
    producer = Producer(producer_config(bootstrap))
    producer.produce(
        topic,
        key=key,
        value=value,
        headers=list(headers or []),  # type: ignore[arg-type]
        on_delivery=lambda error, message: landed.append((error, message)),
    )
    assert producer.flush(30) == 0
    [(error, message)] = landed
    assert error is None, error
    record = Written(topic, message.partition(), message.offset(), key, value, headers or [])
    written.setdefault(NO_KEY if key is None else key.decode(), []).append(record)
    return record


def _raw_event(kind: str, key: str, event_types: dict[str, str]) -> tuple[bytes, list[Any]]:
    """The value and headers of a record of ``kind`` (see the module docstring)."""
    created, shipped = event_types["created"], event_types["event"]

    def headers(event_type: str) -> list[tuple[str, bytes]]:
        return [("event-type", event_type.encode()), ("version", b"2")]

    timestamp = '{"_type_": "datetime_iso", "_data_": "2026-01-01T00:00:00+00:00"}'
    kinds: dict[str, tuple[bytes, list[Any]]] = {
        "garbage": (b"\x00\xff\xfe not an event", []),
        "headerless": (b'{"quantity": 1}', []),
        "os-system": (b'{"command": "true"}', headers("os:system")),
        "foreign-module": (b"{}", headers("smtplib:SMTP")),
        "huge-number": (
            f'{{"timestamp": {timestamp}, "quantity": {"9" * 5000}}}'.encode(),
            headers(shipped),
        ),
        "forged-creation": (
            f'{{"timestamp": {timestamp}, "originator_topic": "os:system"}}'.encode(),
            [("event-type", created.encode()), ("version", b"1")],
        ),
    }
    if kind not in kinds:
        pytest.fail(f"no record kind {kind!r}; kinds: {sorted(kinds)}")
    return kinds[kind]


@when(parsers.parse('a "{kind}" record with key "{key}" is written to the events topic'))
def raw_event(
    instance: InstanceProcess, written: dict[str, list[Written]], kind: str, key: str
) -> None:
    definition, settings = service_of(instance)
    [aggregate] = definition.aggregates.values()  # a service of one aggregate
    event = next(
        name
        for name, member in vars(aggregate).items()
        if isinstance(member, type) and name not in ("Event", "Created")
    )
    types = {
        "created": f"{aggregate.__module__}:{aggregate.__qualname__}.Created",
        "event": f"{aggregate.__module__}:{aggregate.__qualname__}.{event}",
    }
    value, headers = _raw_event(kind, key, types)
    write(instance.bootstrap, written, settings.events_topic, key.encode(), value, headers)


@when(
    parsers.re(
        r'another producer appends two "(?P<event>\w+)" events with a 4300-digit '
        r'"(?P<field>\w+)" to (?P<aggregate>[\w-]+) "(?P<aggregate_id>[^"]+)"'
    )
)
def huge_events(
    instance: InstanceProcess,
    written: dict[str, list[Written]],
    event: str,
    field: str,
    aggregate: str,
    aggregate_id: str,
) -> None:
    """Valid events each of whose numbers encode, but whose sum does not (4301 digits)."""
    definition, settings = service_of(instance)
    cls = _aggregate_class(instance, aggregate)
    target = cls(id=aggregate_id)  # type: ignore[call-arg]
    for _ in range(2):
        target.trigger_event(getattr(cls, event), **{field: HUGE})
    for domain_event in target.collect_events():
        record = definition.codec.encode(domain_event)
        write(
            instance.bootstrap,
            written,
            settings.events_topic,
            record.key,
            record.value,
            list(record.headers),
        )


@then(
    parsers.parse(
        'the store "{store}" returns the 4300-digit "{field}" of the first event for "{key}"'
    )
)
def returns_huge(instance: InstanceProcess, store: str, field: str, key: str) -> None:
    last: list[Any] = []

    def served() -> bool:
        last[:] = [http("GET", f"{instance.url}/stores/{store}/keys/{key}")]
        status, body = last[0]
        return status == 200 and body["value"] == {field: HUGE}

    wait_until(served, lambda: f"{store}/{key} answered {str(last)[:300]}")


@when(parsers.parse('a record with key "{key}" of "{topic}" has the value {value}'))
def keyed_record(
    broker: KafkaCluster, written: dict[str, list[Written]], key: str, topic: str, value: str
) -> None:
    write(broker.bootstrap, written, topic, key.encode(), value.encode())


@when(parsers.parse('a record without a key is written to "{topic}"'))
def keyless_record(broker: KafkaCluster, written: dict[str, list[Written]], topic: str) -> None:
    write(broker.bootstrap, written, topic, None, b'{"text": "whose?"}')


@when(
    parsers.parse('a record with key "{key}" of "{topic}" holds JSON nested {depth:d} levels deep')
)
def deep_record(
    broker: KafkaCluster, written: dict[str, list[Written]], key: str, topic: str, depth: int
) -> None:
    write(broker.bootstrap, written, topic, key.encode(), b"[" * depth + b"]" * depth)


@when("the instance is stopped and started again")
def stop_and_start(instance: InstanceProcess) -> None:
    instance.stop()
    instance.start()
    # A new JVM, then its first micro-batches: generous on a loaded machine.
    instance.wait_ready(timeout=2 * WAIT)


@given(parsers.parse('"{first}" and "{second}" are in different partitions of "{topic}"'))
def different_partitions(broker: KafkaCluster, first: str, second: str, topic: str) -> None:
    count = topic_partitions(admin_client(broker.bootstrap), topic)
    assert count, f"topic {topic!r} does not exist"
    assert partition_for(first.encode(), count) != partition_for(second.encode(), count)


def dead_letters(instance: InstanceProcess, store: str) -> list[Any]:
    """Every record of ``store``'s dead-letter topic."""
    definition, settings = service_of(instance)
    topic = settings.dead_letter_topic(store)
    source = definition.projection(store).source_topic(settings.events_topic)
    partitions = topic_partitions(admin_client(instance.bootstrap), source)
    assert partitions, f"{source} does not exist"
    return [m for batch in read_to_end(instance.bootstrap, topic, partitions) for m in batch]


def _dead_lettered(instance: InstanceProcess, store: str, record: Written, error: str) -> None:
    """Wait until ``store``'s dead-letter topic holds ``record``, and check what it says."""
    coordinates = {
        DLQ_TOPIC_HEADER: record.topic.encode(),
        DLQ_PARTITION_HEADER: str(record.partition).encode(),
        DLQ_OFFSET_HEADER: str(record.offset).encode(),
    }

    def found() -> Any:
        for message in dead_letters(instance, store):
            headers = dict(message.headers() or ())
            if all(headers.get(name) == value for name, value in coordinates.items()):
                return message
        return None

    message = wait_until(found, lambda: f"{store} dead-lettered no record at {coordinates}")
    headers = message.headers() or []
    assert (message.key(), message.value()) == (record.key, record.value)
    assert message.partition() == record.partition
    assert headers[: len(record.headers)] == record.headers  # the original's, first
    found_headers = dict(headers)
    assert found_headers[DLQ_STORE_HEADER] == store.encode()
    assert error in found_headers[DLQ_ERROR_HEADER].decode(), found_headers[DLQ_ERROR_HEADER]


@then(parsers.parse('store "{store}" dead-lettered the record with key "{key}" saying "{error}"'))
def dead_lettered(
    instance: InstanceProcess, written: dict[str, list[Written]], store: str, key: str, error: str
) -> None:
    """The last record this scenario wrote with ``key`` is in the store's dead-letter topic."""
    _dead_lettered(instance, store, written[key][-1], error)


@then(parsers.parse('store "{store}" dead-lettered the record without a key saying "{error}"'))
def dead_lettered_keyless(
    instance: InstanceProcess, written: dict[str, list[Written]], store: str, error: str
) -> None:
    _dead_lettered(instance, store, written[NO_KEY][-1], error)


@then(parsers.parse('nothing was dead-lettered for "{key}" by store "{store}"'))
def nothing_dead_lettered(instance: InstanceProcess, key: str, store: str) -> None:
    keys = [m.key() for m in dead_letters(instance, store)]
    assert key.encode() not in keys, keys


_OUTCOMES = {"dead-lettered": "dead_lettered", "skipped": "skipped", "stopped": "stopped"}


@then(
    parsers.re(
        r"its metrics count (?P<count>\d+) more records? of store \"(?P<store>[\w-]+)\" "
        r"(?P<outcome>dead-lettered|skipped|stopped)"
    )
)
def poison_counted(
    instance: InstanceProcess, metrics_before: Samples, count: str, store: str, outcome: str
) -> None:
    name = "foldstream_projection_poison_records_total"
    labels = frozenset({("store", store), ("outcome", _OUTCOMES[outcome])})
    last: list[float] = []

    def counted() -> bool:
        # A task reports its records once it committed them: after their dead letters landed.
        last[:] = [
            scrape(instance.url).get((name, labels), 0.0) - metrics_before.get((name, labels), 0.0)
        ]
        return last[0] >= int(count)

    wait_until(counted, lambda: f"{name}{dict(labels)} grew by {last}")
    assert last[0] == int(count), last


@then(parsers.parse('commands on every partition still fold into store "{store}"'))
def every_partition_folds(instance: InstanceProcess, store: str) -> None:
    """A new product on each partition of the events topic takes a shipment, and the store
    serves it."""
    definition, _ = service_of(instance)
    [aggregate] = definition.aggregates
    run = uuid.uuid4().hex[:6]
    keys: dict[int, str] = {}
    for n in range(1000):
        key = f"fresh-{run}-{n}"
        keys.setdefault(partition_for(key.encode(), instance.partitions), key)
        if len(keys) == instance.partitions:
            break
    for key in keys.values():
        status, body = http(
            "POST", f"{instance.url}/commands/{aggregate}/{key}/receive_shipment", {"quantity": 1}
        )
        assert status == 200, body
    for key in keys.values():
        store_has_value(instance, store, key)


@then(
    parsers.parse(
        '/ready names the partition of "{key}" in store "{store}" stopped at its offset, '
        'saying "{error}"'
    )
)
def ready_names_stop(
    instance: InstanceProcess, written: dict[str, list[Written]], key: str, store: str, error: str
) -> None:
    record = written[key][-1]
    expected = f"store {store!r} partition {record.partition} stopped at offset {record.offset}: "
    last: list[Any] = []

    def named() -> bool:
        last[:] = [http("GET", f"{instance.url}/ready")]
        status, body = last[0]
        reason = str(body.get("reason", "")) if isinstance(body, dict) else ""
        return status == 503 and expected in reason and error in reason

    wait_until(named, lambda: f"/ready answered {last}, wanted {expected!r}…{error!r}")
