"""The query parameters of the client's range and windows reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TypedDict

from foldstream.routing import MaxLag

#: A bound of a range or windows read: an ISO-8601 time (a datetime without a zone is UTC),
#: epoch milliseconds or an integer sort key, or a text sort key.
Bound = datetime | int | str


class ReadOptions(TypedDict, total=False):
    """The keywords of a range or windows read (``start``/``end``: its ``from``/``to``;
    None: not given)."""

    start: Bound | None
    end: Bound | None
    limit: int | None
    after: str | None
    max_lag: MaxLag
    consistent_with: str | None


def read_params(
    *,
    start: Bound | None = None,
    end: Bound | None = None,
    limit: int | None = None,
    after: str | None = None,
    max_lag: MaxLag = None,
    consistent_with: str | None = None,
) -> dict[str, str]:
    """The query parameters of a read: ``from``/``to`` from ``start``/``end``, and those given.
    Times are sent to the millisecond, rounded up: stored times are whole milliseconds, so
    the same entries are in ``[start, end)`` either way."""
    given = {
        "from": start,
        "to": end,
        "limit": limit,
        "after": after,
        "max_lag": max_lag,
        "consistent_with": consistent_with,
    }
    return {name: _param(name, value) for name, value in given.items() if value is not None}


def _param(name: str, value: Bound) -> str:
    if isinstance(value, bool):  # an int to Python, never a bound or a count a caller meant
        raise TypeError(f"{name} may not be a bool: {value!r}")
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        if aware.microsecond % 1000:
            aware += timedelta(microseconds=1000 - aware.microsecond % 1000)
        return aware.astimezone(UTC).isoformat(timespec="milliseconds")
    return str(int(value)) if isinstance(value, int) else value
