"""Cluster records are untrusted input: strict types, bounds, safe URLs."""

from __future__ import annotations

import json

import pytest

from foldstream.cluster.records import InvalidRecord, MemberState, parse_assignment
from foldstream.settings import valid_url

GOOD = {"id": "inventory-0a1b2c3d", "url": "http://127.0.0.1:8000", "epoch": 3, "generation": 2}


def state(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def test_a_valid_member_state_round_trips() -> None:
    parsed = MemberState.from_json(state(active={"inventory.events": [0, 3]}, lag={"stock/0": 4}))
    assert MemberState.from_json(parsed.to_json()) == parsed
    assert parsed.active == {"inventory.events": [0, 3]}


@pytest.mark.parametrize(
    "changes",
    [
        {"generation": 1e308},  # a float: never an integer here
        {"epoch": "7"},
        {"epoch": True},
        {"epoch": 2**53},
        {"epoch": -1},
        {"active": {"t": [0.5]}},
        {"active": {"t": "0"}},
        {"active": {"bad topic": [0]}},
        {"lag": {"stock/0": -2}},
        {"id": "../../etc"},
        {"id": ""},
        {"url": "http://evil\r\nSet-Cookie: x=1"},
        {"url": "javascript:alert(1)"},
        {"url": "ftp://127.0.0.1"},
        {"url": "http://a b"},
        {"url": "http://user@host"},
        {"url": "http://" + "h" * 3000},
    ],
)
def test_invalid_member_states_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidRecord):
        MemberState.from_json(state(**changes))


@pytest.mark.parametrize(
    "raw",
    [b"", b"null", b"[]", b"{", b"\xff\xfe", b"[" * 100_000, b'{"id": 1}', b"x" * (2 << 20)],
)
def test_garbage_is_refused_not_raised(raw: bytes) -> None:
    with pytest.raises(InvalidRecord):
        MemberState.from_json(raw)
    with pytest.raises(InvalidRecord):
        parse_assignment(raw)


def test_assignments_are_checked_too() -> None:
    good = {"generation": 4, "leader": "a-1", "active": {"t": {"0": "a-1"}}, "members": ["a-1"]}
    assert parse_assignment(json.dumps(good).encode()).owner("t", 0) == "a-1"
    for bad in (
        {**good, "generation": 1e308},
        {**good, "generation": 0},
        {**good, "active": {"t": {"zero": "a-1"}}},
        {**good, "active": {"t": {"0": 7}}},
        {**good, "leader": "a\nb"},
    ):
        with pytest.raises(InvalidRecord):
            parse_assignment(json.dumps(bad).encode())
    with pytest.raises(InvalidRecord):
        parse_assignment(None)


def test_urls_written_into_location_headers_are_plain_http() -> None:
    assert valid_url("https://node-1.example:8443/base")
    assert not valid_url("http://x/\x00")
    assert not valid_url("http://x/\r\n")
