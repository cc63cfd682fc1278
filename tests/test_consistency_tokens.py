"""Consistency tokens (parsed strictly: they come from clients) and the waits for a copy to
apply one (woken by the copy's writer from its own thread)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from foldstream.errors import InvalidRequest
from foldstream.query_api.consistency import has_token, header_value, requested_token
from foldstream.state.applied import AppliedOffsets
from foldstream.tokens import MAX_TOKEN_BYTES, parse_token, token_for


def test_a_token_names_its_position_and_topic() -> None:
    raw = token_for("inventory.events", 3, 41)
    token = parse_token(raw)
    assert (token.partition, token.offset) == (3, 41)
    assert token.of("inventory.events") and not token.of("other.events")
    assert parse_token(raw.encode()) == token
    assert requested_token(b"consistent_with=" + raw.encode(), None) == token
    assert requested_token(b"max_lag=1", raw.encode()) == token
    assert requested_token(b"", None) is None
    assert has_token(b"x=1&consistent_with=" + raw.encode()) and not has_token(b"max_lag=0")
    assert header_value([(b"foldstream-consistent-with", b"t")]) == b"t"


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "garbage",
        "f1-3-41",
        "f2-3-41-00000000",
        "f1-03-41-00000000",  # leading zero
        "f1--3-41-00000000",
        "f1-3-41-0000000G",
        "f1-3-99999999999999999999-00000000",  # beyond 2^63 - 1
        "f1-3-41-00000000\n",
        "f1-3-41-00000000" + "0" * MAX_TOKEN_BYTES,
        "ｆ1-3-41-00000000",
    ],
)
def test_anything_else_is_a_400(raw: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_token(raw)
    assert refused.value.status == 400


def test_a_wait_ends_when_the_offset_is_applied_or_times_out() -> None:
    applied = AppliedOffsets()
    reached = {"offset": -1}

    async def scenario() -> None:
        def apply_soon() -> None:
            reached["offset"] = 7
            applied.applied("stock", 1, 7)

        loop = asyncio.get_running_loop()
        loop.call_soon(threading.Thread(target=apply_soon).start)
        assert await applied.wait("stock", 1, 7, 30.0, lambda: reached["offset"] >= 7)
        # Another partition's progress wakes nobody; a wait for an offset never applied ends
        # after its timeout, saying so.
        applied.applied("stock", 2, 100)
        assert not await applied.wait("stock", 1, 8, 0.05, lambda: reached["offset"] >= 8)
        assert applied.waiting() == 0

    asyncio.run(scenario())
