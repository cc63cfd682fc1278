"""Batch lookups: ``POST /stores/{store}/keys`` with a JSON list of keys.

Answers ``{"values": {"<key>": <stored JSON>, ...}, "missing": ["<key>", ...], "elsewhere":
{"<owner url>": ["<key>", ...]}, "unavailable": ["<key>", ...]}``: values of the keys whose
partitions this instance serves, built from the stored bytes as they are (no decoding and
re-encoding), the keys another instance owns grouped by its URL (send them there), and the keys
nobody can answer right now (retry). One request amortises the HTTP cost over many keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from foldstream.errors import StoreNotFound
from foldstream.kafka import partitions_for
from foldstream.query_api.stores import StoreReaders
from foldstream.responses import error_response
from foldstream.routing import Local, Locator, Redirect

MAX_KEYS = 10_000


def _keys(body: bytes) -> list[str] | str:
    """The requested keys, or what is wrong with the body."""
    try:
        keys = json.loads(body)
    except ValueError as exc:
        return f"malformed JSON: {exc}"
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return "the body must be a JSON list of keys (strings)"
    if len(keys) > MAX_KEYS:
        return f"at most {MAX_KEYS} keys per request, got {len(keys)}"
    return keys


def _json(value: object, empty: bytes) -> bytes:
    # Most answers have nothing missing, elsewhere or unavailable: skip the encoder for those.
    return json.dumps(value).encode() if value else empty


def batch_route(readers: Callable[[], StoreReaders], locator: Callable[[], Locator]) -> Route:
    """``POST /stores/{store}/keys`` over the readers returned by ``readers()``."""

    async def get_keys(request: Request) -> Response:
        store = request.path_params["store"]
        keys = _keys(await request.body())
        if isinstance(keys, str):
            return error_response(400, keys)
        current = readers()
        try:
            info = current.info(store)
        except StoreNotFound as exc:
            return error_response(404, str(exc))
        route = locator()
        found: list[bytes] = []
        missing: list[str] = []
        elsewhere: dict[str, list[str]] = {}
        unavailable: list[str] = []
        by_partition: dict[int, list[str]] = {}
        unique = list(dict.fromkeys(keys))
        raw = [key.encode() for key in unique]
        for key, partition in zip(
            unique, partitions_for(raw, info.partitions, info.partitioner), strict=True
        ):
            by_partition.setdefault(partition, []).append(key)
        for partition, wanted in by_partition.items():
            location = route.locate(info.topic, partition)
            if isinstance(location, Redirect):
                elsewhere.setdefault(location.url, []).extend(wanted)
            elif not isinstance(location, Local):
                unavailable.extend(wanted)
            else:
                values = current.get_many(store, partition, [k.encode() for k in wanted])
                for key, value in zip(wanted, values, strict=True):
                    if value is None:
                        missing.append(key)
                    else:
                        found.append(encode_basestring_ascii(key).encode() + b":" + value)
        body = b'{"values":{%s},"missing":%s,"elsewhere":%s,"unavailable":%s}' % (
            b",".join(found),
            _json(missing, b"[]"),
            _json(elsewhere, b"{}"),
            _json(unavailable, b"[]"),
        )
        return Response(body, media_type="application/json")

    return Route("/stores/{store}/keys", get_keys, methods=["POST"])
