"""``GET /stores/{store}/keys/{key}/range`` and ``.../windows`` over real RocksDB partitions,
through the query routes and the lookup fast path (the same answers, byte for byte)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from foldstream.domain.records import EventRecord
from foldstream.kafka import partition_for
from foldstream.projections import OrderedProjection, WindowedAggregate
from foldstream.projections.fold import fold_partition
from foldstream.query_api import StoreReaders, query_routes
from foldstream.query_api.fast_lookup import FastLookups
from foldstream.query_api.stores import StoreInfo
from foldstream.routing import LocalOnly
from foldstream.state import RocksDBWriter, partition_path
from foldstream.state.format import ORDERED_FORMAT
from foldstream.state.ordered_keys import STREAM_TIME, encode_int
from foldstream.times import to_epoch_ms
from tests.test_batch_lookups import call

PARTITIONS = 2
T0 = to_epoch_ms("2026-05-01T10:00:00Z")
MINUTE = 60_000


def entry(record: EventRecord) -> tuple[Any, bytes]:
    document = json.loads(record.value or b"{}")
    return document["at"], record.value or b""


BOOKINGS = OrderedProjection("bookings", entry=entry, topic="t", sort_key="time")
SCORES = OrderedProjection("scores", entry=entry, topic="t", sort_key="int")
NAMES = OrderedProjection("names", entry=entry, topic="t", sort_key="string")
WINDOWS = WindowedAggregate(
    "sales",
    fold=lambda state, record: {"n": (state or {"n": 0})["n"] + 1},
    size=timedelta(minutes=10),
    grace=timedelta(minutes=1),
    retention=timedelta(hours=1),
    topic="t",
)


def fold(state_dir: Path, projection: Any, records: list[EventRecord]) -> None:
    by_partition: dict[int, list[tuple[int, EventRecord]]] = {}
    for offset, each in enumerate(records):
        partition = partition_for(each.key, PARTITIONS)
        by_partition.setdefault(partition, []).append((offset, each))
    for partition in range(PARTITIONS):
        writer = RocksDBWriter(
            partition_path(state_dir, projection.store, partition),
            identity=f"t/{partition}",
            table_format=ORDERED_FORMAT,
        )
        fold_partition(projection, writer, by_partition.get(partition, []), None)
        writer.close()


def booked(key: str, at: Any, n: int) -> EventRecord:
    return EventRecord(key.encode(), json.dumps({"at": at, "n": n}).encode(), (), 0)


@pytest.fixture
def app(tmp_path: Path) -> Any:
    bookings = [booked("c1", T0 + (n % 7) * MINUTE, n) for n in range(20)]
    bookings += [booked("c2", T0, 99), booked("c/range", T0, 98)]
    fold(tmp_path, BOOKINGS, bookings)
    fold(tmp_path, SCORES, [booked("c1", n, n) for n in (-5, 3, -(2**63), 2**63 - 1)])
    fold(
        tmp_path, NAMES, [booked("c1", name, n) for n, name in enumerate(["b", "a\x00", "a", "é"])]
    )
    sales = [EventRecord(b"c1", b"1", (), T0 + m * MINUTE) for m in (1, 2, 15, 31)]
    fold(tmp_path, WINDOWS, sales)
    readers = StoreReaders.at(
        tmp_path,
        {
            "bookings": StoreInfo.of(BOOKINGS, "t", PARTITIONS),
            "scores": StoreInfo.of(SCORES, "t", PARTITIONS),
            "names": StoreInfo.of(NAMES, "t", PARTITIONS),
            "sales": StoreInfo.of(WINDOWS, "t", PARTITIONS),
            "stock": StoreInfo("t", PARTITIONS, "murmur2"),
        },
    )
    owned = set(range(PARTITIONS))
    routes = Starlette(
        routes=query_routes(
            lambda: readers, lambda: LocalOnly(lambda: owned), lambda: (True, {}), dict
        )
    )
    fast = FastLookups(routes, readers=lambda: readers, locator=lambda: LocalOnly(lambda: owned))
    yield routes, fast
    readers.close()


def get(app: Any, path: str, query: str = "") -> tuple[int, Any]:
    """The answer through the routes, checked to be the fast path's too."""
    routes, fast = app
    slow = call(routes, "GET", path, b"", query.encode(), raw=True)
    assert call(fast, "GET", path, b"", query.encode(), raw=True) == slow
    status, _, body = slow
    return status, json.loads(body)


def test_pages_follow_each_other_without_gaps_or_repeats(app: Any) -> None:
    pages, after = [], None
    while True:
        query = "limit=3" + (f"&after={after}" if after else "")
        status, body = get(app, "/stores/bookings/keys/c1/range", query)
        assert status == 200, body
        pages.append(body["entries"])
        after = body["next"]
        if after is None:
            break
    found = [e["value"]["n"] for page in pages for e in page]
    assert sorted(found) == list(range(20)) and len(pages) == 7
    times = [e["sort_key"] for page in pages for e in page]
    assert times == sorted(times) and times[0] == "2026-05-01T10:00:00.000Z"
    # Equal sort keys keep the order they were written in.
    assert [e["value"]["n"] for page in pages for e in page][:3] == [0, 7, 14]


def test_from_is_inclusive_to_exclusive(app: Any) -> None:
    status, body = get(
        app,
        "/stores/bookings/keys/c1/range",
        "from=2026-05-01T10:02:00Z&to=" + str(T0 + 4 * MINUTE),
    )
    assert status == 200, body
    assert {e["sort_key"] for e in body["entries"]} == {
        "2026-05-01T10:02:00.000Z",
        "2026-05-01T10:03:00.000Z",
    }
    assert body["key"] == "c1" and body["next"] is None
    assert body["served_by"] == {"instance": "local", "role": "active", "partition": 1, "lag": None}


def test_a_page_within_from_and_to_continues_within_them(app: Any) -> None:
    window = "from=2026-05-01T10:01:00%2B00:00&to=2026-05-01T10:03:00Z"
    _, first = get(app, "/stores/bookings/keys/c1/range", window + "&limit=2")
    _, second = get(
        app, "/stores/bookings/keys/c1/range", f"{window}&limit=5&after={first['next']}"
    )
    assert len(first["entries"]) + len(second["entries"]) == 6 and second["next"] is None


def test_int_and_string_sort_keys(app: Any) -> None:
    _, scores = get(app, "/stores/scores/keys/c1/range", "from=-5")
    assert [e["sort_key"] for e in scores["entries"]] == [-5, 3, 2**63 - 1]
    _, names = get(app, "/stores/names/keys/c1/range")
    assert [e["sort_key"] for e in names["entries"]] == ["a", "a\x00", "b", "é"]
    _, some = get(app, "/stores/names/keys/c1/range", "from=a%00&to=%C3%A9")
    assert [e["sort_key"] for e in some["entries"]] == ["a\x00", "b"]


def test_windows_oldest_first_and_none_past_retention(app: Any, tmp_path: Path) -> None:
    status, body = get(app, "/stores/sales/keys/c1/windows")
    assert status == 200, body
    assert [(w["start"][11:16], w["end"][11:16], w["value"]) for w in body["windows"]] == [
        ("10:00", "10:10", {"n": 2}),
        ("10:10", "10:20", {"n": 1}),
        ("10:30", "10:40", {"n": 1}),
    ]
    _, some = get(
        app, "/stores/sales/keys/c1/windows", "from=2026-05-01T10:05Z&to=2026-05-01T10:30Z"
    )
    assert [w["start"][11:16] for w in some["windows"]] == ["10:10"]
    # Stream time moves past 10:00-10:10's retention (10:10 + 1 h) before the fold deletes it.
    partition = partition_for(b"c1", PARTITIONS)
    writer = RocksDBWriter(
        partition_path(tmp_path, "sales", partition),
        identity=f"t/{partition}",
        table_format=ORDERED_FORMAT,
    )
    writer.write({STREAM_TIME: encode_int(T0 + 70 * MINUTE)}, 99)
    writer.close()
    _, later = get(app, "/stores/sales/keys/c1/windows")
    assert [w["start"][11:16] for w in later["windows"]] == ["10:10", "10:30"]


def test_a_key_ending_in_range_is_looked_up_with_its_slash_encoded(app: Any) -> None:
    status, body = get(app, "/stores/bookings/keys/c%2Frange/range")
    assert status == 200 and body["key"] == "c/range" and len(body["entries"]) == 1


@pytest.mark.parametrize(
    ("path", "query", "status", "says"),
    [
        ("/stores/bookings/keys/c1/range", "from=yesterday", 400, "from must be a time"),
        ("/stores/bookings/keys/c1/range", "to=2026-05-01T10:00:00+02:00", 400, "to must be"),
        ("/stores/bookings/keys/c1/range", "from=2026-05-02&to=2026-05-01", 400, "after to"),
        ("/stores/bookings/keys/c1/range", "limit=0", 400, "limit must be"),
        ("/stores/bookings/keys/c1/range", "limit=1001", 400, "limit must be"),
        ("/stores/bookings/keys/c1/range", "limit=%D9%A3", 400, "limit must be"),
        ("/stores/bookings/keys/c1/range", "after=not*a*cursor", 400, "not a cursor"),
        ("/stores/bookings/keys/c1/range", "after=AAAA", 400, "not a cursor"),
        ("/stores/bookings/keys/c1/range", "from=%FF", 400, "not valid UTF-8"),
        ("/stores/bookings/keys/c1/range", "max_lag=-1", 400, "max_lag"),
        ("/stores/scores/keys/c1/range", "from=1.5", 400, "from must be a int"),
        ("/stores/scores/keys/c1/range", "to=9223372036854775808", 400, "to must be"),
        ("/stores/stock/keys/c1/range", "", 400, "not ordered but point"),
        ("/stores/sales/keys/c1/range", "", 400, "not ordered but windowed"),
        ("/stores/bookings/keys/c1/windows", "", 400, "not windowed but ordered"),
        ("/stores/bookings/keys/c1", "", 400, "not point but ordered"),
        ("/stores/nowhere/keys/c1/range", "", 404, "no store named 'nowhere'"),
        ("/stores/bookings/keys/%FF/range", "", 400, "not valid UTF-8"),
    ],
)
def test_bad_requests(app: Any, path: str, query: str, status: int, says: str) -> None:
    got, body = get(app, path, query)
    assert (got, says in body["error"]) == (status, True), body


def test_a_cursor_outside_from_and_to_or_altered_is_refused(app: Any) -> None:
    _, first = get(app, "/stores/bookings/keys/c1/range", "limit=2")
    cursor = first["next"]
    status, body = get(
        app, "/stores/bookings/keys/c1/range", f"from=2026-05-01T10:05Z&after={cursor}"
    )
    assert status == 400 and "outside" in body["error"], body
    altered = cursor[:-1] + ("A" if cursor[-1] != "A" else "B")
    status, body = get(app, "/stores/bookings/keys/c1/range", f"after={altered}")
    assert status in (200, 400), body  # another valid position, or none: never a 500
    status, body = get(app, "/stores/bookings/keys/c1/range", f"after={cursor}=")
    assert status == 400, body
