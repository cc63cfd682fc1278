"""The records a store forwards into a multi-input store's repartition topic, and the keys a
store partition reserves for forwarding's bookkeeping.

A forwarded record's key is the key it is folded under downstream (the *new* key), its
partition ``murmur2(key) % partitions`` of the repartition topic (as a Java producer would put
it: the query router finds it there), and two headers say where it comes from:

==============================  ================================================================
header                          value (ASCII unless said)
==============================  ================================================================
``foldstream-forward``          ``<input> <kind> <emitter> <topic> <partition> <offset> <seq>
                                <prev>``: the downstream store's input it is for (its index),
                                its kind (:data:`KINDS`), its *origin* (the emitting store, and
                                the topic and partition it folded), its *position* there (the
                                source offset and a sequence number within that offset) and the
                                position of the emitter's previous record to the same repartition
                                partition (``-`` for none)
``foldstream-forward-key``      the key upstream (bytes as they are): the aggregate id of an
                                event, the key of a changed value
==============================  ================================================================

The value is the event's own (its headers come first, before these two) for kind ``event``, and
the JSON array ``[old, new]`` of the changed value's JSON (``null`` for none) for the others.
Anyone who may write to the repartition topic can forge one, as anyone who may write to the
events topic can forge an event: restrict writes to the service's instances with ACLs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from foldstream.domain.records import EventRecord
from foldstream.errors import UndecodableRecord

FORWARD_HEADER = "foldstream-forward"
FORWARD_KEY_HEADER = "foldstream-forward-key"

EVENT, ADD, SUBTRACT, UPDATE, CHANGE = "event", "add", "subtract", "update", "change"
#: ``event``: a domain event re-keyed; ``add`` / ``subtract``: a value entering or leaving its
#: group; ``update``: a value changing within its group (subtracted, then added, at once);
#: ``change``: a changed value under the same key.
KINDS = frozenset({EVENT, ADD, SUBTRACT, UPDATE, CHANGE})

#: The first byte of every key a store partition keeps for itself (marks, cursors, progress):
#: never a value's key, never served (the query API refuses keys starting with a NUL).
RESERVED = b"\x00"
PROGRESS_KEY = RESERVED + b"progress"


class Origin(NamedTuple):
    """Who forwarded a record: the emitting store, and the topic and partition it folded."""

    emitter: str
    topic: str
    partition: int


Position = tuple[int, int]
"""``(source offset, sequence number within it)``: the order of an origin's records."""


class Forwarded(NamedTuple):
    """What a forwarded record's headers say (see the module docstring)."""

    input: int
    kind: str
    origin: Origin
    position: Position
    prev: Position | None
    upstream_key: bytes


def forward_headers(forwarded: Forwarded) -> list[tuple[str, bytes]]:
    """The two headers of ``forwarded``."""
    prefix = header_prefix(forwarded.input, forwarded.kind, forwarded.origin)
    return [
        (FORWARD_HEADER, forward_header(prefix, forwarded.position, forwarded.prev)),
        (FORWARD_KEY_HEADER, forwarded.upstream_key),
    ]


def header_prefix(input: int, kind: str, origin: Origin) -> bytes:
    """The first fields of :data:`FORWARD_HEADER`, the same for all records of one origin,
    input and kind: an emitter computes them once, not per record."""
    return f"{input} {kind} {origin.emitter} {origin.topic} {origin.partition} ".encode()


def forward_header(prefix: bytes, position: Position, prev: Position | None) -> bytes:
    """:data:`FORWARD_HEADER`'s value: ``prefix`` (:func:`header_prefix`), then the
    record's position and its predecessor's."""
    return b"%s%d %d %s" % (prefix, *position, b"-" if prev is None else position_bytes(prev))


#: More than the fields :func:`header_prefix` writes can take: an input index, a kind, the
#: emitting store's name and the topic it folds (each part of a Kafka topic name: at most 249
#: characters) and a partition. A longer one is malformed, and never cached.
MAX_PREFIX_BYTES = 1024


def parse_forwarded(record: EventRecord) -> Forwarded:
    """The headers of a forwarded record; :class:`UndecodableRecord` if it is none (anything
    may have been written to the topic)."""
    text = upstream_key = None
    for name, value in record.headers:
        if name == FORWARD_HEADER:
            text = value
        elif name == FORWARD_KEY_HEADER:
            upstream_key = value
    if text is None or upstream_key is None:
        raise UndecodableRecord(
            f"record with key {(record.key or b'')[:100]!r} is not a forwarded record: headers "
            f"{FORWARD_HEADER!r} and {FORWARD_KEY_HEADER!r} are required"
        )
    try:
        prefix, offset, seq, prev = text.rsplit(None, 3)
        if len(prefix) > MAX_PREFIX_BYTES:
            raise ValueError(f"its origin's fields take more than {MAX_PREFIX_BYTES} bytes")
        index, kind, origin = _prefix_fields(prefix)
        return Forwarded(
            index,
            kind,
            origin,
            (_natural(offset), _natural(seq)),
            None if prev == b"-" else parse_position(prev.decode("ascii")),
            upstream_key,
        )
    except ValueError as exc:
        raise UndecodableRecord(
            f"malformed {FORWARD_HEADER!r} header {text[:200]!r}: {exc}"
        ) from None


@functools.lru_cache(maxsize=4096)
def _prefix_fields(prefix: bytes) -> tuple[int, str, Origin]:
    """The fields :func:`header_prefix` wrote, which all records of one origin, input and kind
    share: parsed once for them. Anyone may write to the topic: the cache holds at most 4,096
    prefixes of at most :data:`MAX_PREFIX_BYTES` (some MB), and keeps no failure."""
    index, kind_bytes, emitter, topic, partition = prefix.split()
    kind = kind_bytes.decode("ascii")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind[:20]!r}")
    return (
        _natural(index),
        kind,
        Origin(emitter.decode("ascii"), topic.decode("ascii"), _natural(partition)),
    )


def origin_fields(record: EventRecord) -> bytes | None:
    """The origin's fields of ``record``'s :data:`FORWARD_HEADER` as sent (emitter, topic and
    partition, unchecked), or None without the header: records of one origin share them, so a
    chunk parses one record per origin (:func:`parse_forwarded` checks them)."""
    text = record.header(FORWARD_HEADER)
    return None if text is None else b" ".join(text.split(None, 5)[2:5])


def _natural(text: str | bytes) -> int:
    """A decimal of at most 18 digits (what an offset or an index can be)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise ValueError(f"{text[:20]!r} is not a natural number")
    return int(text)


def parse_position(text: str) -> Position:
    offset, _, seq = text.partition(":")
    return _natural(offset), _natural(seq)


def position_bytes(position: Position) -> bytes:
    return b"%d:%d" % position


def change_value(old: bytes | None, new: bytes | None) -> bytes:
    """The value of a forwarded change: ``[old, new]`` built from the stored JSON as it is."""
    return b"[" + (old or b"null") + b"," + (new or b"null") + b"]"
