"""The bench's Spark Kafka source design reads the rows Spark hands ``mapInArrow`` into the same
records foldstream's own source folds."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from bench.spark_kafka import records_of_arrow
from foldstream.domain.records import EventRecord

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
#: The schema Spark 4's Kafka source rows arrive in (``includeHeaders``), less the columns the
#: bench leaves in the JVM.
KAFKA_ROWS = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="Etc/UTC")),
        ("headers", pa.list_(HEADER)),
    ]
)


def _rows() -> pa.RecordBatch:
    at = datetime(2026, 11, 29, 1, 2, 3, 456000, tzinfo=UTC)
    return pa.RecordBatch.from_pylist(
        [
            {
                "partition": 1,
                "offset": 7,
                "key": b"sku-1",
                "value": b"{}",
                "timestamp": at,
                "headers": [
                    {"key": "event-type", "value": b"T"},
                    {"key": "version", "value": b"1"},
                ],
            },
            {
                "partition": 0,
                "offset": 3,
                "key": None,
                "value": None,
                "timestamp": None,
                "headers": None,
            },
            {
                "partition": 1,
                "offset": 9,  # 8 was a transaction's commit marker
                "key": b"sku-2",
                "value": b"{}",
                "timestamp": at,
                "headers": [{"key": "empty", "value": None}],
            },
        ],
        schema=KAFKA_ROWS,
    )


def test_rows_become_each_partitions_records_in_order_with_headers_and_milliseconds() -> None:
    millis = int(datetime(2026, 11, 29, 1, 2, 3, 456000, tzinfo=UTC).timestamp() * 1000)

    assert records_of_arrow(_rows()) == {
        1: [
            (7, EventRecord(b"sku-1", b"{}", (("event-type", b"T"), ("version", b"1")), millis)),
            (9, EventRecord(b"sku-2", b"{}", (("empty", None),), millis)),  # type: ignore[arg-type]
        ],
        0: [(3, EventRecord(None, None, (), None))],
    }


def test_a_slice_of_the_rows_keeps_each_rows_own_headers() -> None:
    """Arrow slices share their parent's children: each row's headers are found from the
    list's offsets into them, not from the slice's start."""
    whole = records_of_arrow(_rows())

    assert records_of_arrow(_rows().slice(2)) == {1: whole[1][1:]}
    assert records_of_arrow(_rows().slice(0, 1)) == {1: whole[1][:1]}


def test_a_null_headers_list_has_no_headers_whatever_its_offsets_span() -> None:
    """Arrow allows a null list's offsets to span child entries of any content."""
    entries = pa.array([{"key": "a", "value": b"1"}, {"key": "b", "value": b"2"}], HEADER)
    headers = pa.ListArray.from_arrays(
        pa.array([0, 1, 2], pa.int32()), entries, mask=pa.array([False, True])
    )
    rows = pa.RecordBatch.from_arrays(
        [
            pa.array([0, 0], pa.int32()),
            pa.array([1, 2], pa.int64()),
            pa.array([b"k", b"k"]),
            pa.array([b"{}", b"{}"]),
            pa.array([None, None], pa.timestamp("us", tz="Etc/UTC")),
            headers,
        ],
        schema=KAFKA_ROWS,
    )

    assert records_of_arrow(rows) == {
        0: [
            (1, EventRecord(b"k", b"{}", (("a", b"1"),), None)),
            (2, EventRecord(b"k", b"{}", (), None)),
        ]
    }
