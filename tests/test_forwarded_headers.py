"""A forwarded record's headers: what an emitter writes parses back to what it said, and a
malformed or forged header is an undecodable record (a poison record of its store), never an
error of another kind."""

from __future__ import annotations

import pytest

from foldstream.domain.records import EventRecord
from foldstream.errors import UndecodableRecord
from foldstream.projections.forwarded import (
    ADD,
    EVENT,
    FORWARD_HEADER,
    FORWARD_KEY_HEADER,
    KINDS,
    Forwarded,
    Origin,
    forward_headers,
    parse_forwarded,
)


def _record(header: bytes, upstream: bytes = b"acct-1") -> EventRecord:
    return EventRecord(
        b"asset-1", b"{}", ((FORWARD_HEADER, header), (FORWARD_KEY_HEADER, upstream))
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("prev", [None, (0, 0), (12_345, 2)])
def test_headers_parse_back_to_what_they_say(kind: str, prev: tuple[int, int] | None) -> None:
    said = Forwarded(
        3, kind, Origin("exposure.events", "trades.events", 7), (12_346, 1), prev, b"k"
    )
    record = EventRecord(b"asset-1", b"{}", tuple(forward_headers(said)))
    assert parse_forwarded(record) == said
    assert parse_forwarded(record) == said  # the origin's fields, parsed once, are the same


def test_header_text_is_the_documented_format() -> None:
    said = Forwarded(0, ADD, Origin("song_plays", "charts.events", 2), (41, 0), (40, 1), b"s1")
    assert forward_headers(said) == [
        (FORWARD_HEADER, b"0 add song_plays charts.events 2 41 0 40:1"),
        (FORWARD_KEY_HEADER, b"s1"),
    ]


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"0 event e t 1 5 0",  # a field missing
        b"0 event e t 1 5 0 - extra",  # a field too many
        b"0 smuggle e t 1 5 0 -",  # an unknown kind
        b"x event e t 1 5 0 -",
        b"0 event e t -1 5 0 -",
        b"0 event e t 1 5 0 4",  # a previous position without its sequence number
        b"0 event e t 1 5 0 4:x",
        b"0 event e t 1 9999999999999999999 0 -",  # more than 18 digits
        b"0 event e\xff t 1 5 0 -",  # not ASCII, in the origin's fields
        b"0 event e t 1 5\xd9\xa3 0 -",  # not ASCII, in the position
        "0 event e t 1 \u0663 0 -".encode(),  # a non-ASCII digit
        b"0 event " + b"e" * 1100 + b" t 1 5 0 -",  # longer than any store's name can be
    ],
)
def test_malformed_headers_are_undecodable_records(header: bytes) -> None:
    with pytest.raises(UndecodableRecord, match="malformed"):
        parse_forwarded(_record(header))


def test_a_record_without_the_headers_is_undecodable() -> None:
    with pytest.raises(UndecodableRecord, match="not a forwarded record"):
        parse_forwarded(EventRecord(b"k", b"{}", ((FORWARD_HEADER, b"0 event e t 1 5 0 -"),)))


def test_the_longest_names_a_store_and_its_topic_can_have_parse() -> None:
    longest = "s" * 249  # Kafka's limit on a topic name, which a store's name is part of
    said = Forwarded(
        0, EVENT, Origin(longest, longest, 1_000_000), (10**18 - 1, 3), (10**18 - 1, 2), b"k"
    )
    record = EventRecord(b"asset-1", b"{}", tuple(forward_headers(said)))
    assert parse_forwarded(record) == said
