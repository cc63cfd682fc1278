"""The bodies of range and window answers, and the strict reading of their parameters.

``GET /stores/{store}/keys/{key}/range?from=&to=&limit=&after=`` answers ``{"key", "entries":
[{"sort_key", "value"}], "next", "served_by"}`` from an ordered store: the key's entries whose
sort keys are in ``[from, to)`` (both optional), at most ``limit`` (default
:data:`DEFAULT_LIMIT`, at most :data:`MAX_LIMIT`), sort key order. ``next`` is an opaque
cursor: sent back as ``after`` (with the same ``from`` and ``to``), it answers the next page;
null on the last page.

``GET /stores/{store}/keys/{key}/windows?from=&to=&limit=&after=`` answers ``{"key",
"windows": [{"start", "end", "value"}], "next", "served_by"}`` from a windowed store: the key's
windows whose start is in ``[from, to)``, oldest first, at most ``limit`` (default and most
:data:`MAX_LIMIT`), windows past retention left out.

Times are given out as ISO-8601 UTC with milliseconds (``2026-05-01T10:10:00.000Z``) and
taken as ISO-8601 (a ``+`` in an offset sent as ``%2B``; no offset: UTC) or epoch
milliseconds. Routing, limits and errors are those of a lookup
(:mod:`~foldstream.query_api.answers`, which calls this module).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from foldstream.errors import InvalidRequest
from foldstream.http_input import MAX_INT, MIN_INT, InputLimits
from foldstream.query_api.stores import StoreInfo
from foldstream.state.base import Entries
from foldstream.state.ordered_keys import (
    OFFSET_BYTES,
    SortKeyType,
    encode_int,
    encode_sort_key,
    entry_prefix,
    prefix_end,
    split_sort_key,
)
from foldstream.times import iso_ms_bytes, to_epoch_ms

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
RANGE = b"/range"
WINDOWS = b"/windows"
_PARAMS = ("from", "to", "limit", "after")
_CURSOR = re.compile(rb"[A-Za-z0-9_-]+")
_INTEGER = re.compile(r"-?[0-9]{1,19}")


@dataclass(frozen=True)
class Span:
    """What a range or windows request reads: stored keys in ``[start, end)``, at most
    ``limit`` of them, of a routing key whose entries start with ``prefix``."""

    prefix: bytes
    start: bytes
    end: bytes
    limit: int
    windows: bool


def ordered_params(query_string: bytes) -> dict[str, str]:
    """``from``, ``to``, ``limit`` and ``after`` (the last of each), percent-decoded strictly:
    values that are not UTF-8 are refused, never replaced."""
    found: dict[str, str] = {}
    for pair in query_string.split(b"&"):
        name, _, value = pair.partition(b"=")
        decoded = unquote_to_bytes(name.replace(b"+", b" ")).decode("latin-1")
        if decoded in _PARAMS:
            raw = unquote_to_bytes(value.replace(b"+", b" "))
            try:
                found[decoded] = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidRequest(f"{decoded} is not valid UTF-8: {exc}") from None
    return found


def span_of(
    info: StoreInfo, key: bytes, params: dict[str, str], limits: InputLimits, windows: bool
) -> Span:
    """The stored keys a request with ``params`` reads (InvalidRequest for a bad parameter)."""
    kind: SortKeyType = info.sort_key or "time"
    prefix = entry_prefix(key)
    lower = upper = None
    if (low := params.get("from")) is not None:
        lower = _bound(kind, "from", low, limits)
    if (high := params.get("to")) is not None:
        upper = _bound(kind, "to", high, limits)
    if lower is not None and upper is not None and lower > upper:
        raise InvalidRequest(f"from ({low!r}) is after to ({high!r})")
    start = prefix + (lower or b"")
    end = prefix_end(prefix) if upper is None else prefix + upper
    raw_limit = params.get("limit")
    limit = MAX_LIMIT if windows and raw_limit is None else _limit(raw_limit)
    after = params.get("after")
    if after is not None:
        position = prefix + _cursor(kind, after, windows, limits)
        if not start <= position < end:
            raise InvalidRequest(
                "after is outside [from, to): send it with the from and to of the page it came from"
            )
        start = position + b"\x00"  # the first key after it
    return Span(prefix, start, end, limit, windows)


def _bound(kind: SortKeyType, name: str, raw: str, limits: InputLimits) -> bytes:
    try:
        if kind == "time":
            return encode_int(to_epoch_ms(raw))
        if kind == "int":
            if _INTEGER.fullmatch(raw) is None or not MIN_INT <= int(raw) <= MAX_INT:
                raise ValueError(f"{raw[:40]!r} is not a 64-bit integer")
            return encode_int(int(raw))
        if len(raw.encode()) > limits.max_key_bytes:
            raise ValueError(f"longer than {limits.max_key_bytes} bytes")
        return encode_sort_key("string", raw)
    except ValueError as exc:
        raise InvalidRequest(f"{name} must be a {kind} sort key: {exc}") from None


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or len(raw) > 4 or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}, got {raw[:40]!r}")
    return int(raw)


def cursor_of(stored: bytes, prefix: bytes) -> str:
    """The ``next`` cursor after the entry stored at ``stored``: its key past the prefix."""
    return base64.urlsafe_b64encode(stored[len(prefix) :]).rstrip(b"=").decode("ascii")


def _cursor(kind: SortKeyType, text: str, windows: bool, limits: InputLimits) -> bytes:
    """The stored key suffix an ``after`` cursor names; InvalidRequest unless it is one
    this store could have given out."""
    raw = text.encode("ascii", errors="replace")
    bad = InvalidRequest("after is not a cursor of this store: send back a next as it came")
    if len(raw) > 4 * (limits.max_key_bytes + 32) // 3 or not _CURSOR.fullmatch(raw):
        raise bad
    try:
        suffix = base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    if cursor_of(suffix, b"") != text:
        raise bad  # only the canonical spelling: one cursor per position
    try:
        _, rest = split_sort_key("time" if windows else kind, suffix)
    except ValueError:
        raise bad from None
    if len(rest) != (0 if windows else OFFSET_BYTES):
        raise bad
    return suffix


def entries_body(
    key: str, info: StoreInfo, span: Span, entries: Entries, served_by: bytes
) -> bytes:
    """The body of a 200 answer to a range (``span.windows`` False) or windows request, from
    the entries read (up to ``span.limit + 1``: one more says whether a next page exists)."""
    page, more = entries[: span.limit], len(entries) > span.limit
    cut = len(span.prefix)
    if span.windows:
        name, items = b"windows", _windows(page, cut, info.window_ms or 0)
    else:
        name, items = b"entries", _entries(page, cut, info.sort_key or "time")
    after = json.dumps(cursor_of(page[-1][0], span.prefix)).encode() if more else b"null"
    return b"".join(
        (b'{"key":', json.dumps(key).encode(), b',"', name, b'":[', b",".join(items), b'],"next":')
        + (after, b',"served_by":', served_by, b"}")
    )


# Every entry of a page goes through one of these: the sort key is read in place (8 bytes
# after the prefix for times, integers and window starts), with no call per entry but the
# time's formatting (a day's date formatted once per page, not a datetime per entry).
_FROM_BYTES = int.from_bytes
_SIGN = 1 << 63


def _windows(page: Entries, cut: int, size: int) -> list[bytes]:
    end = cut + 8
    return [
        b'{"start":"%s","end":"%s","value":%s}'
        % (iso_ms_bytes(start), iso_ms_bytes(start + size), value)
        for start, value in ((_FROM_BYTES(k[cut:end], "big") - _SIGN, v) for k, v in page)
    ]


def _entries(page: Entries, cut: int, kind: SortKeyType) -> list[bytes]:
    end = cut + 8
    if kind == "time":
        return [
            b'{"sort_key":"%s","value":%s}'
            % (iso_ms_bytes(_FROM_BYTES(k[cut:end], "big") - _SIGN), v)
            for k, v in page
        ]
    if kind == "int":
        return [
            b'{"sort_key":%d,"value":%s}' % (_FROM_BYTES(k[cut:end], "big") - _SIGN, v)
            for k, v in page
        ]
    return [
        b'{"sort_key":%s,"value":%s}' % (json.dumps(split_sort_key(kind, k[cut:])[0]).encode(), v)
        for k, v in page
    ]
