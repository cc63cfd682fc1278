"""The shapes of foldstream's HTTP answers: every error is ``{"error": "<reason>"}``.

An :class:`Answer` is a whole answer as bytes (status, headers, body): the query side's fast
paths write it straight to the socket, the Starlette routes wrap it in a ``Response``
(:func:`to_response`), so both send the same bytes.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from starlette.responses import JSONResponse, Response

Headers = list[tuple[bytes, bytes]]
JSON_TYPE = (b"content-type", b"application/json")
NO_STORE = (b"cache-control", b"no-store")


class Answer(NamedTuple):
    """An HTTP answer: its status, its headers (never ``content-length``: the sender adds it)
    and its body."""

    status: int
    headers: Headers
    body: bytes


def json_bytes(content: object) -> bytes:
    """``content`` as Starlette's ``JSONResponse`` renders it."""
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def error_answer(
    status: int, message: str, headers: Headers | None = None, **fields: object
) -> Answer:
    """``{"error": message, **fields}`` with ``status``."""
    return Answer(status, [*(headers or []), JSON_TYPE], json_bytes({"error": message, **fields}))


def to_response(answer: Answer) -> Response:
    """``answer`` as a Starlette response: the same headers, then ``content-length``."""
    response = Response(answer.body, status_code=answer.status)
    response.raw_headers = [*answer.headers, (b"content-length", b"%d" % len(answer.body))]
    return response


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)
