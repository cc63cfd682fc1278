"""A multi-input store's task reads each chunk's forwarded headers for its marks and its fold:
every origin's mark is read ahead, malformed records hide none, a record is folded as its
store's ``apply`` folds it, and duplicates and records sent after a gap are still skipped
(on RocksDB, without Spark or a broker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from foldstream.domain import EventCodec
from foldstream.domain.records import EventRecord
from foldstream.examples.positions import Account, add_trade, traded_asset
from foldstream.projections import EventProjection, Join
from foldstream.projections.dedup import origins_of
from foldstream.projections.forwarded import (
    EVENT,
    FORWARD_HEADER,
    FORWARD_KEY_HEADER,
    RESERVED,
    Forwarded,
    Origin,
    Position,
    forward_headers,
)
from foldstream.projections.staged import Staging
from foldstream.service import Service
from foldstream.state import RocksDBWriter

SERVICE = Service(
    "trades",
    aggregates={"account": Account},
    projections=[EventProjection("exposure", add_trade, key=traded_asset)],
)
ORIGINS = [Origin("exposure.events", "trades.events", p) for p in range(3)]


def trades(count: int) -> list[tuple[EventRecord, str]]:
    """``count`` purchases of three accounts, two assets, each with the asset it is of."""
    codec = EventCodec([Account])
    accounts = [Account(id=f"a{n}") for n in range(3)]
    for account in accounts:
        account.collect_events()
    found = []
    for n in range(count):
        account = accounts[n % 3]
        account.buy(f"asset-{n % 2}", n + 1)
        found += [(codec.encode(e), f"asset-{n % 2}") for e in account.collect_events()]
    return found


def forwarded(
    event: EventRecord, key: str, origin: Origin, position: Position, prev: Position | None
) -> EventRecord:
    assert event.key is not None
    headers = forward_headers(Forwarded(0, EVENT, origin, position, prev, event.key))
    return EventRecord(key.encode(), event.value, (*event.headers, *headers))


def interleaved(count: int) -> list[EventRecord]:
    """The forwarded records of ``count`` trades, from the three origins in turn, each
    origin's records in order with their ``prev``."""
    last: dict[Origin, Position | None] = dict.fromkeys(ORIGINS)
    records = []
    for n, (event, key) in enumerate(trades(count)):
        origin = ORIGINS[n % 3]
        position = (n, 0)
        records.append(forwarded(event, key, origin, position, last[origin]))
        last[origin] = position
    return records


def fold_chunks(path: Path, chunks: list[list[EventRecord]], join: Any = None) -> dict[str, Any]:
    """``chunks`` folded one after another (each read ahead, folded, committed) into one
    partition of ``exposure`` (or ``join``) at ``path``; its values, reserved keys left out."""
    join = join or SERVICE.projection("exposure")
    staging = Staging.of({"topic": "trades.exposure.repartition"}, join, SERVICE.projections, None)
    assert staging is not None
    writer = RocksDBWriter(path, identity="exposure/0")
    offset = 0
    try:
        for chunk in chunks:
            records = list(enumerate(chunk, start=offset))
            offset += len(chunk)
            stage = staging.stage(0)
            stage.keys(records)
            folded = stage.fold(writer, records, None, None)
            assert folded is not None and folded.last_offset is not None
            writer.commit(folded.last_offset)
        return {
            key.decode(): json.loads(value)
            for key, value in writer._db.items()
            if isinstance(key, bytes) and not key.startswith(RESERVED)
        }
    finally:
        writer.close()


def expected(count: int) -> dict[str, Any]:
    state: dict[str, Any] = {}
    codec = EventCodec([Account])
    for event, key in trades(count):
        state[key] = add_trade(state.get(key), codec.decode(event))
    return state


def test_every_origin_is_read_ahead_once_and_malformed_records_hide_none() -> None:
    records = interleaved(9)
    event = records[0]
    text = dict(event.headers)[FORWARD_HEADER]
    # Malformed records first: one naming origin 1, one without the headers at all.
    fields = text.split(b" ")
    fields[4], fields[5] = b"1", b"x"  # origin 1's partition; an offset that is no number
    broken = EventRecord(
        event.key,
        event.value,
        tuple(
            (name, b" ".join(fields) if name == FORWARD_HEADER else value)
            for name, value in event.headers
        ),
    )
    unforwarded = EventRecord(
        event.key,
        event.value,
        tuple(h for h in event.headers if h[0] not in (FORWARD_HEADER, FORWARD_KEY_HEADER)),
    )
    assert origins_of([broken, unforwarded, *records]) == ORIGINS


def test_a_chunk_folds_as_the_store_folds_each_record(tmp_path: Path) -> None:
    records = interleaved(30)
    assert fold_chunks(tmp_path / "p", [records[:7], records[7:20], records[20:]]) == expected(30)


def test_duplicates_and_records_after_a_gap_are_skipped(tmp_path: Path) -> None:
    records = interleaved(12)
    # Origin 0's record at offset 3 is lost: its successor (offset 6) and the ones after it
    # wait for the retry that sends them all again, after copies of what came before.
    lost = records[3]
    first = [r for r in records if r is not lost]
    assert fold_chunks(tmp_path / "p", [first, records]) == expected(12)


def test_a_join_overriding_apply_keeps_its_override(tmp_path: Path) -> None:
    class Counted(Join):
        """``exposure`` with each fold counted into the value."""

        def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
            value = json.loads(super().apply(current, record) or b"{}")
            before = json.loads(current)["folds"] if current else 0
            return json.dumps({**value, "folds": before + 1}).encode()

    exposure = SERVICE.projection("exposure")
    assert isinstance(exposure, Join)
    counted = Counted(exposure.store, exposure.inputs).for_events(exposure.codec)
    values = fold_chunks(tmp_path / "p", [interleaved(10)], join=counted)
    assert {key: value.pop("folds") for key, value in values.items()} == {
        "asset-0": 5,
        "asset-1": 5,
    }
    assert values == expected(10)
