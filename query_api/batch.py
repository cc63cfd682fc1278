"""Batch lookups: ``POST /stores/{store}/keys`` with a JSON list of keys.

Answers ``{"values": {"<key>": <stored JSON>, ...}, "missing": ["<key>", ...]}``, built from the
stored bytes as they are (no decoding and re-encoding of values), so one request amortises the
HTTP cost of a lookup over many keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from foldstream.errors import StoreNotFound
from foldstream.query_api.stores import StoreReaders
from foldstream.responses import error_response

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


def batch_route(readers: Callable[[], StoreReaders]) -> Route:
    """``POST /stores/{store}/keys`` over the readers returned by ``readers()``."""

    async def get_keys(request: Request) -> Response:
        store = request.path_params["store"]
        keys = _keys(await request.body())
        if isinstance(keys, str):
            return error_response(400, keys)
        unique = list(dict.fromkeys(keys))
        try:
            values = readers().get_many(store, [key.encode() for key in unique])
        except StoreNotFound as exc:
            return error_response(404, str(exc))
        found: list[bytes] = []
        missing: list[str] = []
        for key, value in zip(unique, values, strict=True):
            if value is None:
                missing.append(key)
            else:
                found.append(encode_basestring_ascii(key).encode() + b":" + value)
        body = b'{"values":{%s},"missing":%s}' % (
            b",".join(found),
            json.dumps(missing).encode(),
        )
        return Response(body, media_type="application/json")

    return Route("/stores/{store}/keys", get_keys, methods=["POST"])
