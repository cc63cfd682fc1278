"""The client's range and windows bounds arrive at the server as the times the caller meant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import urlencode

import pytest

from foldstream.client.flows import read_params
from foldstream.query_api.range_answers import ordered_params
from foldstream.times import to_epoch_ms


def server_reads(**options: object) -> dict[str, str]:
    """What the server's parameter reading makes of the query the client sends."""
    return ordered_params(urlencode(read_params(**options)).encode())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "start",
    [
        datetime(2031, 5, 1, 10, 0, tzinfo=UTC),
        datetime(2031, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2))),  # its '+' as %2B
        datetime(2031, 5, 1, 10, 0),  # no zone: UTC, as the server reads a time without offset
        to_epoch_ms("2031-05-01T10:00:00Z"),
    ],
)
def test_a_bound_reaches_the_server_as_the_same_instant(start: datetime | int) -> None:
    assert to_epoch_ms(server_reads(start=start)["from"]) == to_epoch_ms("2031-05-01T10:00:00Z")


def test_a_time_between_milliseconds_is_rounded_up() -> None:
    """Stored times are whole milliseconds: [10:00:00.0005, ...) holds what
    [10:00:00.001, ...) holds, and [..., 10:00:00.0005) what [..., 10:00:00.001) holds."""
    end = datetime(2031, 5, 1, 10, 0, 0, 500, tzinfo=UTC)
    assert server_reads(end=end)["to"] == "2031-05-01T10:00:00.001+00:00"
    exact = datetime(2031, 5, 1, 10, 0, 0, 2000, tzinfo=UTC)
    assert server_reads(start=exact)["from"] == "2031-05-01T10:00:00.002+00:00"


def test_text_and_cursors_pass_unchanged_and_none_is_left_out() -> None:
    assert server_reads(start="a b+c&d", after="Zm9v_-", limit=40, end=None) == {
        "from": "a b+c&d",
        "after": "Zm9v_-",
        "limit": "40",
    }


def test_a_bool_is_refused() -> None:
    with pytest.raises(TypeError, match="limit may not be a bool"):
        read_params(limit=True)
