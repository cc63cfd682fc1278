"""Batch lookups: ``POST /stores/{store}/keys`` with a JSON list of keys.

Answers ``{"values": {"<key>": <stored JSON>, ...}, "missing": ["<key>", ...], "elsewhere":
{"<owner url>": ["<key>", ...]}, "unavailable": ["<key>", ...]}``: values of the keys whose
partitions this instance serves, built from the stored bytes as they are (no decoding and
re-encoding), the keys another instance owns grouped by its URL (send them there), and the keys
nobody can answer right now (retry). One request amortises the HTTP cost over many keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring_ascii
from typing import cast

from foldstream.errors import InvalidRequest
from foldstream.http_input import RESERVED_KEY_PREFIX, RESERVED_KEYS, InputLimits, has_bytes
from foldstream.kafka import partitions_for
from foldstream.query_api.stores import StoreReaders
from foldstream.routing import Local, Locator, Redirect


class BadBatch(InvalidRequest):
    """The body of a batch lookup is not a JSON list of at most ``max_batch_keys`` keys
    (strings of at most ``max_key_bytes`` UTF-8 bytes). Remedy: send ``["<key>", ...]``,
    splitting longer lists over several requests."""


def _keys(body: bytes, limits: InputLimits, plain: bool) -> list[bytes]:
    """The UTF-8 bytes of the requested keys, each once; :class:`BadBatch` if the body is no
    JSON list of at most ``max_batch_keys`` strings of at most ``max_key_bytes``. ``plain``:
    the body is printable ASCII without escapes (:func:`_is_plain`)."""
    try:
        keys = json.loads(body)
    except ValueError as exc:
        raise BadBatch(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise BadBatch("malformed JSON: nested too deeply") from None
    if not isinstance(keys, list):
        raise BadBatch(_NOT_KEYS)
    if len(keys) > limits.max_batch_keys:
        raise BadBatch(f"at most {limits.max_batch_keys} keys per request, got {len(keys)}")
    try:
        # str.encode refuses anything but a string (dict.fromkeys refused lists and objects).
        raw = list(map(str.encode, dict.fromkeys(keys)))
    except TypeError:
        raise BadBatch(_NOT_KEYS) from None
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800"): no UTF-8 key has it
        raise BadBatch(f"keys must be valid Unicode: {exc}") from None
    if plain and len(body) <= limits.max_key_bytes:
        return raw  # keys spelled as their bytes: none is longer than the body, none has a NUL
    if raw and (longest := max(map(len, raw))) > limits.max_key_bytes:
        raise BadBatch(f"a key is {longest} bytes long; at most {limits.max_key_bytes}")
    # JSON spells a NUL "\u0000" (strict parsing refuses a raw one): most bodies skip the loop.
    if has_bytes(body, b"\\u0000") and any(key.startswith(RESERVED_KEY_PREFIX) for key in raw):
        raise BadBatch(f"a key starting with a NUL byte is reserved: {RESERVED_KEYS}")
    return raw


_NOT_KEYS = "the body must be a JSON list of keys (strings)"


def _is_plain(body: bytes) -> bool:
    """Whether ``body`` is printable ASCII without escapes: a UTF-8 body (UTF-16 and -32 hold
    NULs, and JSON strings hold no raw control characters) whose keys' JSON is their bytes in
    quotes. DEL, which JSON allows raw, is left out: the encoder escapes it."""
    # find, not ``in`` (see has_bytes), and no generator: this runs for every batch.
    return (
        body.isascii()
        and body.find(b"\\") == -1
        and body.find(b"\x00") == -1
        and body.find(b"\x7f") == -1
    )


#: ``key":value`` of a plain key: the entries are joined by ``,"`` after a first ``"`` (a
#: bytes join of the pair, cheaper than formatting ``"key":value`` per key). The pairs it
#: joins hold no None: missing keys are taken out first.
_PLAIN_ENTRY = cast("Callable[[tuple[bytes, bytes | None]], bytes]", b'":'.join)


def _json(value: object, empty: bytes) -> bytes:
    # Most answers have nothing missing, elsewhere or unavailable: skip the encoder for those.
    return json.dumps(value).encode() if value else empty


def _decoded(keys: list[bytes]) -> list[str]:
    return [key.decode() for key in keys]


def batch_answer(
    current: StoreReaders,
    route: Locator,
    store: str,
    body: bytes,
    limits: InputLimits,
    not_yet: int | None = None,
) -> bytes:
    """The JSON answer to a batch lookup of the keys in ``body`` from ``store``; the keys of
    partition ``not_yet`` (whose copy here has not applied a query's consistency token) are
    answered as unavailable.

    Raises :class:`BadBatch` (a 400) or :class:`~foldstream.errors.StoreNotFound` (a 404).
    """
    # The keys of a plain body are answered without encoding each again (a tenth of a 100-key
    # batch's CPU).
    plain = _is_plain(body)
    raw = _keys(body, limits, plain)
    info = current.info(store)
    found: list[bytes] = []
    missing: list[str] = []
    elsewhere: dict[str, list[str]] = {}
    unavailable: list[str] = []
    by_partition: list[list[bytes]] = [[] for _ in range(info.partitions)]
    add_to = [keys.append for keys in by_partition]
    for partition, key in zip(
        partitions_for(raw, info.partitions, info.partitioner), raw, strict=True
    ):
        add_to[partition](key)
    for partition, wanted in enumerate(by_partition):
        if not wanted:
            continue
        location = route.locate(info.topic, partition)
        if isinstance(location, Redirect):
            elsewhere.setdefault(location.url, []).extend(_decoded(wanted))
            continue
        if not isinstance(location, Local) or partition == not_yet:
            unavailable += _decoded(wanted)
            continue
        values = current.get_many(store, partition, wanted)
        pairs: Iterable[tuple[bytes, bytes | None]] = zip(wanted, values, strict=True)
        if None in values:
            pairs = list(pairs)
            missing += [key.decode() for key, value in pairs if value is None]
            pairs = [pair for pair in pairs if pair[1] is not None]
        if plain:
            found += map(_PLAIN_ENTRY, pairs)
        else:
            found += [
                b"%s:%s" % (encode_basestring_ascii(key.decode()).encode(), value)
                for key, value in pairs
            ]
    entries = b'"' + b',"'.join(found) if plain and found else b",".join(found)
    return b'{"values":{%s},"missing":%s,"elsewhere":%s,"unavailable":%s}' % (
        entries,
        _json(missing, b"[]"),
        _json(elsewhere, b"{}"),
        _json(unavailable, b"[]"),
    )
