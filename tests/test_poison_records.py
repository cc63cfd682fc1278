"""Poison records in a projection task, on real parts without Spark: records folded through a
store host into RocksDB, changed values to a changelog topic and poison records to a
dead-letter topic on the broker, for each store policy (``on_error``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from foldstream.broker import KafkaCluster
from foldstream.domain import EventRecord
from foldstream.errors import BrokerUnavailable
from foldstream.examples.inventory import service as inventory
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics
from foldstream.projections import fold_task
from foldstream.projections.chunks import Records
from foldstream.projections.poison import (
    DLQ_ERROR_HEADER,
    DLQ_KEY_OMITTED_HEADER,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_STORE_HEADER,
    DLQ_TOPIC_HEADER,
    DLQ_VALUE_OMITTED_HEADER,
    ERROR_HEADER_BYTES,
    bounded_utf8,
)
from foldstream.projections.query_groups import store_entries, stores_option
from foldstream.projections.task_output import MAX_VALUE_BYTES
from foldstream.state.host import StoreHost
from foldstream.testing.kafka import read_topic

PARTITIONS = 2
STORES = ("stock", "flaky", "flaky_skipped", "flaky_stopped")
HUGE = int("9" * 4300)  # the most digits Python turns into a string


@dataclass
class Reports:
    """What tasks reported to the store host: poison records by store and outcome."""

    poison: list[tuple[str, dict[str, int]]] = field(default_factory=list)


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def host(tmp_path: Path, reports: Reports) -> Iterator[StoreHost]:
    host = StoreHost(
        state_dir=tmp_path / "state",
        on_poison=lambda store, outcomes: reports.poison.append((store, dict(outcomes))),
    )
    host.start()
    for store in STORES:
        for partition in range(PARTITIONS):
            host.open(store, partition, identity=f"t/{store}/{partition}", epoch=1)
    yield host
    host.stop()


def options(broker: KafkaCluster, host: StoreHost, store: str) -> dict[str, str]:
    """A task's options folding into ``store`` of ``host``, with changelog and dead-letter
    topics of its own."""
    prefix = f"poison-{uuid.uuid4().hex[:8]}.{store}"
    ensure_topics(
        broker.bootstrap,
        [
            TopicSpec(f"{prefix}.changelog", PARTITIONS, compact=True),
            TopicSpec(f"{prefix}.dlq", PARTITIONS),
        ],
    )
    service = "foldstream.examples.inventory" if store == "stock" else "foldstream.testing.flaky"
    return {
        "stores": stores_option(
            [
                {
                    "store": store,
                    "changelog_topic": f"{prefix}.changelog",
                    "dead_letter_topic": f"{prefix}.dlq",
                }
            ]
        ),
        "service": f"{service}:service",
        "store_host": host.address,
        "store_token": host.authkey.hex(),
        "topic": "source.topic",
        "bootstrap": broker.bootstrap,
    }


def run(task: dict[str, str], fetches: list[dict[int, Records]]) -> dict[int, tuple[int, int]]:
    return fold_task.fold_task(task, iter(fetches), dict)


def dead_letters(broker: KafkaCluster, task: dict[str, str]) -> list[tuple]:  # type: ignore[type-arg]
    return read_topic(broker.bootstrap, topic_of(task, "dead_letter_topic"), PARTITIONS)


def topic_of(task: dict[str, str], kind: str) -> str:
    """The ``changelog_topic`` or ``dead_letter_topic`` of ``task``'s store."""
    return str(store_entries(task)[0][kind])


def value_of(host: StoreHost, store: str, partition: int, key: bytes) -> object:
    held = host.partition(store, partition)
    assert held is not None
    value = held.get(key)
    return None if value is None else json.loads(value)


def applied_offset(host: StoreHost, store: str, partition: int) -> int | None:
    held = host.partition(store, partition)
    assert held is not None
    return held.applied_offset()


def product_events(key: str, *quantities: int) -> list[EventRecord]:
    product = Product(id=key)
    for quantity in quantities:
        product.receive_shipment(quantity)
    return [inventory.codec.encode(e) for e in product.collect_events()]


def typed(key: bytes, event_type: bytes, value: bytes, version: bytes = b"2") -> EventRecord:
    return EventRecord(key, value, (("event-type", event_type), ("version", version)))


SHIPMENT = b"foldstream.examples.inventory.domain:Product.ShipmentReceived"


def test_records_that_are_no_event_of_the_service_are_dead_lettered_and_the_store_moves_on(
    broker: KafkaCluster, host: StoreHost, reports: Reports
) -> None:
    created, shipped, shipped_again = product_events("p0", 1, 1)
    timestamp = json.dumps(json.loads(shipped.value or b"{}")["timestamp"]).encode()
    poison = [
        EventRecord(b"p0", b"\x00\xffnot json", ()),  # no headers
        typed(b"p0", b"os:system", b'{"command": "true"}'),  # a module that is not an event
        typed(b"p0", SHIPMENT, b'{"quantity": %s, "timestamp": %s}' % (b"9" * 5000, timestamp)),
        typed(b"p0", SHIPMENT, b'{"timestamp": %s}' % timestamp),  # lacks a field
    ]
    records = list(enumerate([created, shipped, *poison, shipped_again]))
    task = options(broker, host, "stock")
    assert run(task, [{0: records}]) == {0: (7, 6)}

    assert value_of(host, "stock", 0, b"p0") == {"on_hand": 2}
    assert applied_offset(host, "stock", 0) == 6
    letters = dead_letters(broker, task)
    assert [(p, key, value) for p, _, key, value, _ in letters] == [
        (0, r.key, r.value) for r in poison
    ]
    expected_errors = [
        "UndecodableRecord: record with key b'p0' is not a foldstream event",
        "UndecodableRecord: unknown event type 'os:system'",
        "UndecodableRecord: cannot decode event",
        "UndecodableRecord: event 'foldstream.examples.inventory.domain:Product.Shipment"
        "Received' lacks its fields ['quantity']",
    ]
    for (_, _, _, _, headers), record, offset, error in zip(
        letters, poison, range(2, 6), expected_errors, strict=True
    ):
        found = dict(headers)
        assert headers[: len(record.headers)] == list(record.headers)  # the original's first
        assert found[DLQ_ERROR_HEADER].decode().startswith(error), found[DLQ_ERROR_HEADER]
        assert (found[DLQ_TOPIC_HEADER], found[DLQ_PARTITION_HEADER]) == (b"source.topic", b"0")
        assert (found[DLQ_OFFSET_HEADER], found[DLQ_STORE_HEADER]) == (
            str(offset).encode(),
            b"stock",
        )
    assert reports.poison == [("stock", {"dead_lettered": 4})]
    changelog = read_topic(broker.bootstrap, topic_of(task, "changelog_topic"), PARTITIONS)
    assert [(key, json.loads(value)) for _, _, key, value, _ in changelog] == [
        (b"p0", {"on_hand": 2})
    ]


def test_a_sum_too_large_to_encode_is_dead_lettered_and_the_key_keeps_its_value(
    broker: KafkaCluster, host: StoreHost
) -> None:
    records = list(enumerate(product_events("big", HUGE, HUGE)))
    task = options(broker, host, "stock")
    assert run(task, [{1: records}]) == {1: (3, 2)}
    assert value_of(host, "stock", 1, b"big") == {"on_hand": HUGE}
    [(_, offset, key, _, headers)] = dead_letters(broker, task)
    assert (offset, key) == (0, b"big")
    assert b"Exceeds the limit (4300 digits)" in dict(headers)[DLQ_ERROR_HEADER]
    assert dict(headers)[DLQ_OFFSET_HEADER] == b"2"


def test_a_chunk_of_poison_records_only_moves_the_stored_offset(
    broker: KafkaCluster, host: StoreHost
) -> None:
    task = options(broker, host, "stock")
    garbage = [(offset, EventRecord(b"k", b"?", ())) for offset in (3, 4)]
    assert run(task, [{0: garbage}]) == {0: (2, 4)}
    assert applied_offset(host, "stock", 0) == 4
    held = host.partition("stock", 0)
    assert held is not None and held.changelog_offset() is None
    assert held.get(b"k") is None
    assert read_topic(broker.bootstrap, topic_of(task, "changelog_topic"), PARTITIONS) == []
    assert len(dead_letters(broker, task)) == 2


def plan(tmp_path: Path, **fail: int) -> bytes:
    return json.dumps({"fail": fail, "marker": str(tmp_path / "attempts")}).encode()


def attempts(tmp_path: Path, store: str) -> int:
    return len((tmp_path / f"attempts.{store}").read_text().splitlines())


def test_a_record_that_fails_twice_is_applied_on_its_third_attempt(
    broker: KafkaCluster, host: StoreHost, tmp_path: Path, reports: Reports
) -> None:
    task = options(broker, host, "flaky")
    value = plan(tmp_path, flaky=2)
    assert run(task, [{0: [(0, EventRecord(b"k", value, ()))]}]) == {0: (1, 0)}
    assert value_of(host, "flaky", 0, b"k") == json.loads(value)
    assert attempts(tmp_path, "flaky") == 3
    assert dead_letters(broker, task) == []
    assert reports.poison == []


def test_the_skip_policy_moves_past_a_record_without_dead_lettering_it(
    broker: KafkaCluster, host: StoreHost, tmp_path: Path, reports: Reports
) -> None:
    task = options(broker, host, "flaky_skipped")
    records = [
        (0, EventRecord(b"k", b'{"n": 1}', ())),
        (1, EventRecord(b"k", plan(tmp_path, flaky_skipped=1000), ())),
        (2, EventRecord(b"j", b'{"n": 2}', ())),
    ]
    assert run(task, [{0: records}]) == {0: (3, 2)}
    assert (value_of(host, "flaky_skipped", 0, b"k"), value_of(host, "flaky_skipped", 0, b"j")) == (
        {"n": 1},
        {"n": 2},
    )
    assert attempts(tmp_path, "flaky_skipped") == 3
    assert dead_letters(broker, task) == []
    assert reports.poison == [("flaky_skipped", {"skipped": 1})]


def test_the_stop_policy_stops_one_partition_after_committing_what_came_before(
    broker: KafkaCluster, host: StoreHost, tmp_path: Path, reports: Reports
) -> None:
    store, task = "flaky_stopped", options(broker, host, "flaky_stopped")
    poison = EventRecord(b"k", plan(tmp_path, flaky_stopped=3), ())
    partition_0 = [(0, EventRecord(b"k", b'{"n": 1}', ())), (1, poison)]
    later = [(2, EventRecord(b"k", b'{"n": 2}', ()))]
    partition_1 = [(0, EventRecord(b"j", b'{"n": 3}', ()))]
    assert run(task, [{0: partition_0, 1: partition_1}, {0: later}]) == {0: (1, 0), 1: (1, 0)}

    assert (applied_offset(host, store, 0), value_of(host, store, 0, b"k")) == (0, {"n": 1})
    assert value_of(host, store, 1, b"j") == {"n": 3}  # the other partition goes on
    [((stopped_store, partition), stop)] = host.stopped().items()
    assert (stopped_store, partition, stop.offset) == (store, 0, 1)
    assert stop.error == "RuntimeError: failing on purpose: attempt 3 of 3"
    assert reports.poison == [(store, {"stopped": 1})]
    assert dead_letters(broker, task) == []

    # Later micro-batches leave it alone, even from before the stop (a replayed one).
    assert run(task, [{0: partition_0 + later}]) == {}
    assert applied_offset(host, store, 0) == 0

    # Held again (moved away and back, or a restart), it folds from the record it stopped at.
    host.close([(store, 0)])
    host.open(store, 0, identity=f"t/{store}/0", epoch=2)
    assert host.stopped() == {}
    assert run(task, [{0: [(1, poison), *later]}]) == {0: (2, 2)}
    assert value_of(host, store, 0, b"k") == {"n": 2}
    assert attempts(tmp_path, store) == 4


def test_an_infrastructure_error_fails_the_task_and_moves_past_no_record(
    broker: KafkaCluster, host: StoreHost, tmp_path: Path
) -> None:
    outage = tmp_path / "outage"
    outage.touch()
    task = options(broker, host, "flaky")
    value = json.dumps({"unavailable": {"flaky": str(outage)}}).encode()
    records = [(0, EventRecord(b"k", b'{"n": 1}', ())), (1, EventRecord(b"k", value, ()))]
    with pytest.raises(BrokerUnavailable, match="unavailable on purpose"):
        run(task, [{0: records}])
    assert applied_offset(host, "flaky", 0) is None
    assert dead_letters(broker, task) == []
    outage.unlink()
    assert run(task, [{0: records}]) == {0: (2, 1)}
    assert value_of(host, "flaky", 0, b"k") == json.loads(value)


def test_a_poison_record_is_dead_lettered_whole_or_without_what_makes_it_too_large(
    broker: KafkaCluster, host: StoreHost
) -> None:
    task = options(broker, host, "flaky")
    large = b'"' + b"x" * 999_898 + b'"'  # fits a record, not with the error's headers too
    records: Records = [
        (5, EventRecord(None, b"{}", ())),  # type: ignore[arg-type]
        (6, EventRecord(None, large, ())),  # type: ignore[arg-type]
        (7, EventRecord(b"k" * 999_900, b"{}", ())),  # a key too large for a stored value
    ]
    assert run(task, [{1: records}]) == {1: (3, 7)}
    whole, valueless, keyless = dead_letters(broker, task)
    assert (whole[2], whole[3]) == (None, b"{}")
    assert dict(whole[4])[DLQ_ERROR_HEADER].startswith(b"UndecodableRecord: a record without a key")
    assert (valueless[2], valueless[3]) == (None, None)
    assert dict(valueless[4])[DLQ_VALUE_OMITTED_HEADER] == str(len(large)).encode()
    assert dict(valueless[4])[DLQ_OFFSET_HEADER] == b"6"
    assert (keyless[2], keyless[3]) == (None, None)
    found = dict(keyless[4])
    assert (found[DLQ_KEY_OMITTED_HEADER], found[DLQ_OFFSET_HEADER]) == (b"999900", b"7")
    assert found[DLQ_ERROR_HEADER].startswith(b"ValueTooLarge")


def test_an_error_header_is_valid_utf8_of_bounded_length() -> None:
    assert bounded_utf8("short") == b"short"
    long = "é" * ERROR_HEADER_BYTES + "\udc80"  # two bytes a character, and a lone surrogate
    cut = bounded_utf8(long)
    assert len(cut) <= ERROR_HEADER_BYTES and cut.endswith(b"...")
    assert cut.decode("utf-8")  # cut at a character, never inside one
    assert bounded_utf8("a\udc80b") == b"a?b"


def test_a_value_too_large_for_the_changelog_is_a_poison_record(
    broker: KafkaCluster, host: StoreHost
) -> None:
    task = options(broker, host, "flaky")
    huge = b'"' + b"x" * MAX_VALUE_BYTES + b'"'
    records = [(0, EventRecord(b"k", b'{"n": 1}', ())), (1, EventRecord(b"k", huge, ()))]
    assert run(task, [{0: records}]) == {0: (2, 1)}
    assert value_of(host, "flaky", 0, b"k") == {"n": 1}
    [(_, _, key, value, headers)] = dead_letters(broker, task)
    assert (key, value) == (b"k", huge)
    assert dict(headers)[DLQ_ERROR_HEADER].startswith(b"ValueTooLarge: the value of b'k'")
