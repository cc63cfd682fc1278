"""The pieces between Kafka and the fold: task planning, header transport, decoding."""

from __future__ import annotations

import pyarrow as pa
from eventsourcing.persistence import StoredEvent

from foldstream.domain import EventCodec
from foldstream.examples.inventory.domain import Product
from foldstream.projections.sink import records_by_partition
from foldstream.projections.source import (
    ARROW_SCHEMA,
    KafkaRange,
    decode_headers,
    encode_headers,
    plan_tasks,
)


def test_small_batches_are_one_task_and_large_ones_are_balanced() -> None:
    spans = [KafkaRange(p, 0, n) for p, n in enumerate([10, 0, 30, 20])]
    (single,) = plan_tasks(spans, tasks=2, single_task_records=100)
    assert [s.partition for s in single.spans] == [0, 2, 3]  # empty partitions are left out
    split = plan_tasks(spans, tasks=2, single_task_records=5)
    assert sorted(sum(s.size for s in t.spans) for t in split) == [30, 30]
    assert sorted(s.partition for t in split for s in t.spans) == [0, 2, 3]  # each once, whole
    assert plan_tasks([KafkaRange(0, 5, 5)], tasks=2, single_task_records=5) == []


def test_headers_travel_as_one_binary_value() -> None:
    headers = [("event-type", b"x:Y"), ("version", b"3"), ("empty", None)]
    assert decode_headers(encode_headers(headers)) == tuple(headers)
    assert encode_headers([]) is None and decode_headers(None) == ()


def test_records_are_split_by_partition_in_offset_order() -> None:
    rows = [(1, 7), (0, 3), (1, 5), (0, 4)]
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "partition": p,
                "offset": o,
                "key": b"k%d" % o,
                "value": b"v",
                "headers": encode_headers([("n", b"%d" % o)]),
            }
            for p, o in rows
        ],
        schema=ARROW_SCHEMA,
    )
    found = records_by_partition([batch])
    assert {p: [o for o, _ in r] for p, r in found.items()} == {0: [3, 4], 1: [5, 7]}
    offset, record = found[1][0]
    assert (record.key, record.value, record.headers) == (b"k5", b"v", (("n", b"5"),))


def test_fast_decode_matches_the_eventsourcing_mapper() -> None:
    codec = EventCodec()
    product = Product(id="sku-9")
    product.receive_shipment(quantity=4)
    product.sell(quantity=1)
    for domain_event in product.collect_events():
        record = codec.encode(domain_event)
        stored = StoredEvent(
            originator_id=record.key.decode(),
            originator_version=int(record.header("version") or b"0"),
            topic=(record.header("event-type") or b"").decode(),
            state=record.value or b"",
        )
        expected = codec._mapper.to_domain_event(stored)
        decoded = codec.decode(record)
        assert type(decoded) is type(expected) and vars(decoded) == vars(expected)
