"""How ordered and windowed stores lay their entries out in RocksDB keys (the ``ordered/1``
format of :mod:`foldstream.state.format`).

An entry's key is::

    ENTRY + varint(len(routing key)) + routing key + sort key [+ source offset]

The routing key is the Kafka key (it decides the partition, so all entries of a routing key are
in one partition and one owner answers a range); its length in front makes the prefix
unambiguous whatever bytes the key holds, so all entries of a routing key are contiguous, in
sort key order. Sort keys are encoded so that byte order is their order:

- ``time`` and ``int``: a signed 64-bit integer (epoch milliseconds for ``time``) big-endian
  with its sign bit flipped;
- ``string``: UTF-8 (bytewise order is code point order), each NUL byte written as ``00 FF``,
  ended by ``00``: no encoding is a prefix of another, so a suffix never disturbs the order.

An ordered store's entries end with the source offset of the record that wrote them (8 bytes
big-endian): records with equal sort keys under one routing key are all kept, in the order they
were written. A windowed store's entries are its windows, keyed by their start (a ``time``) with
no suffix. Windowed stores also keep a time-ordered index of their windows (``EXPIRY`` + window
start + routing key, so that expired windows are found without reading the others) and the
partition's stream time (``STREAM_TIME``): both are ordinary keys, so the changelog carries
them to every copy with the windows themselves.
"""

from __future__ import annotations

from typing import Literal

ENTRY = b"\x00"
EXPIRY = b"\x01"
STREAM_TIME = b"\x02"

SortKeyType = Literal["time", "int", "string"]
SORT_KEY_TYPES: tuple[SortKeyType, ...] = ("time", "int", "string")
_SIGN = 1 << 63
_INT64 = (1 << 64) - 1
OFFSET_BYTES = 8
_BYTES = [bytes((n,)) for n in range(0x80)]


def varint(n: int) -> bytes:
    """``n`` (non-negative) as LEB128: 7 bits a byte, low bits first."""
    if n < 0x80:
        return _BYTES[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """The LEB128 number at ``data[pos:]`` and the position after it (ValueError if cut)."""
    n = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or oversized varint")
        byte = data[pos]
        n |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return n, pos
        shift += 7


def entry_prefix(routing_key: bytes) -> bytes:
    """The prefix every entry of ``routing_key`` starts with."""
    return ENTRY + varint(len(routing_key)) + routing_key


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        raise ValueError("no key follows a prefix of 0xFF bytes only")
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def encode_int(n: int) -> bytes:
    """A signed 64-bit integer, in byte order (ValueError outside -2**63 .. 2**63 - 1)."""
    if not -_SIGN <= n < _SIGN:
        raise ValueError(f"{n} is outside the signed 64-bit integers")
    return ((n + _SIGN) & _INT64).to_bytes(8, "big")


def decode_int(raw: bytes) -> int:
    return int.from_bytes(raw, "big") - _SIGN


def encode_string(text: str) -> bytes:
    return text.encode("utf-8").replace(b"\x00", b"\x00\xff") + b"\x00"


def decode_string(data: bytes, pos: int = 0) -> tuple[str, int]:
    """The string encoded at ``data[pos:]`` and the position after it (ValueError if it is
    not one)."""
    out = bytearray()
    while True:
        end = data.find(b"\x00", pos)
        if end < 0:
            raise ValueError("unterminated string")
        out += data[pos:end]
        if end + 1 < len(data) and data[end + 1] == 0xFF:
            out.append(0)
            pos = end + 2
        else:
            return out.decode("utf-8"), end + 1


def encode_sort_key(kind: SortKeyType, value: int | str) -> bytes:
    """A sort key (epoch milliseconds for ``time``) in byte order."""
    if kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"a string sort key must be text, not {value!r}")
        return encode_string(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"an {kind} sort key must be an integer, not {value!r}")
    return encode_int(value)


def split_sort_key(kind: SortKeyType, data: bytes) -> tuple[int | str, bytes]:
    """The sort key at the start of ``data`` and the bytes after it (ValueError if there is
    none)."""
    if kind == "string":
        text, pos = decode_string(data)
        return text, data[pos:]
    if len(data) < 8:
        raise ValueError("truncated sort key")
    return decode_int(data[:8]), data[8:]


def entry_key(routing_key: bytes, sort_key: bytes, offset: int) -> bytes:
    """An ordered store's entry: ``sort_key`` (encoded) written at source ``offset``."""
    return entry_prefix(routing_key) + sort_key + offset.to_bytes(OFFSET_BYTES, "big")


def window_key(routing_key: bytes, start_ms: int) -> bytes:
    return entry_prefix(routing_key) + encode_int(start_ms)


def expiry_key(start_ms: int, routing_key: bytes) -> bytes:
    return EXPIRY + encode_int(start_ms) + varint(len(routing_key)) + routing_key


def expiry_end(start_ms: int) -> bytes:
    """The smallest index key of a window starting at ``start_ms`` or later."""
    return EXPIRY + encode_int(start_ms)


def window_of_expiry(key: bytes) -> bytes:
    """The window key an index key names."""
    start = key[1:9]
    length, pos = read_varint(key, 9)
    routing_key = key[pos : pos + length]
    return entry_prefix(routing_key) + start
