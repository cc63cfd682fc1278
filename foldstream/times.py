"""Times as ordered and windowed stores take them in and give them out: milliseconds since the
Unix epoch inside, ISO-8601 UTC (``2026-05-01T10:15:00.000Z``) out, ISO-8601 or epoch
milliseconds in.

Only times a :class:`~datetime.datetime` can hold are accepted (years 1 to 9999), so that every
stored time can be given out again.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = _EPOCH.replace(tzinfo=UTC)
_MS = timedelta(milliseconds=1)
#: The earliest and latest milliseconds a time may be (0001-01-01 .. 9999-12-31, UTC).
MIN_MS = (datetime(1, 1, 1) - _EPOCH) // _MS
MAX_MS = (datetime(9999, 12, 31, 23, 59, 59, 999000) - _EPOCH) // _MS
_EPOCH_MS = re.compile(r"-?[0-9]{1,15}")
#: Longer text is no ISO-8601 time (with nanoseconds and an offset it is 35 characters).
_MAX_TEXT = 64

Time = int | str | datetime
"""A time as given: epoch milliseconds, ISO-8601 text (or epoch milliseconds as digits), or
a :class:`~datetime.datetime` (naive ones are taken as UTC)."""


def to_epoch_ms(value: Time) -> int:
    """``value`` in milliseconds since the epoch (ValueError if it is no time, or out of
    range)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time")
    if isinstance(value, int):
        ms = value
    elif isinstance(value, datetime):
        ms = _datetime_ms(value)
    elif isinstance(value, str):
        ms = _text_ms(value)
    else:
        raise ValueError(f"{value!r} is not a time: give ISO-8601 text or epoch milliseconds")
    if not MIN_MS <= ms <= MAX_MS:
        raise ValueError(f"time {value!r} is outside the years 1 to 9999")
    return ms


def iso_to_ms(text: str) -> int:
    """ISO-8601 ``text`` (as ``datetime.isoformat`` writes it) in epoch milliseconds: the
    shorter way of :func:`to_epoch_ms` for timestamps known to be ISO-8601."""
    ms = _datetime_ms(datetime.fromisoformat(text))
    if not MIN_MS <= ms <= MAX_MS:
        raise ValueError(f"time {text!r} is outside the years 1 to 9999")
    return ms


def _text_ms(text: str) -> int:
    if len(text) > _MAX_TEXT:
        raise ValueError(f"{text[:_MAX_TEXT]!r}... is not a time")
    stripped = text.strip()
    if _EPOCH_MS.fullmatch(stripped):
        return int(stripped)
    try:
        parsed = datetime.fromisoformat(stripped)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give ISO-8601 (2026-05-01T10:15:00Z) or epoch milliseconds"
        ) from None
    return _datetime_ms(parsed)


def _datetime_ms(value: datetime) -> int:
    return (value - (_EPOCH if value.tzinfo is None else _EPOCH_UTC)) // _MS


def iso_ms(ms: int) -> str:
    """``ms`` (epoch milliseconds) as ISO-8601 UTC with milliseconds and ``Z``."""
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds") + "Z"


_DAY_MS = 86_400_000
#: ``YYYY-MM-DDT`` of the days :func:`iso_ms_bytes` formatted lately, by day since the epoch.
_DAYS: dict[int, bytes] = {}
_MAX_DAYS = 4096


def iso_ms_bytes(ms: int) -> bytes:
    """:func:`iso_ms` as ASCII bytes (the same text, and the same error for a time out of
    range), for pages of times: each day's date is formatted once and the time of day by
    arithmetic, about twice as fast as a datetime per time."""
    day, rest = divmod(ms, _DAY_MS)
    date = _DAYS.get(day)
    if date is None:
        if len(_DAYS) >= _MAX_DAYS:
            _DAYS.clear()
        date = _DAYS[day] = iso_ms(day * _DAY_MS)[:11].encode("ascii")
    seconds, milli = divmod(rest, 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return b"%s%02d:%02d:%02d.%03dZ" % (date, hours, minutes, seconds, milli)
