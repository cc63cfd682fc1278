"""Limits on what an HTTP request may carry, and the strict parsers that enforce them.

Everything read from HTTP is untrusted: every path segment, parameter and body goes through
this module before it becomes a key, a name, a number or a command's arguments, on every path
a request can take (the Starlette routes and the query side's fast paths alike). A request
that breaks a rule gets :class:`~foldstream.errors.InvalidRequest` (a 4xx JSON answer), never a
500 and never an effect on other requests.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote_to_bytes

from foldstream.errors import ConfigurationError, InvalidRequest

if TYPE_CHECKING:  # the settings (and so the CLI) import this module: Starlette loads to serve
    from starlette.requests import Request


def has_bytes(data: bytes, part: bytes) -> bool:
    """``part in data``, for the hot paths: CPython's ``bytes.__contains__`` first tries ``part``
    as an integer and raises and clears a ``TypeError`` for every ``bytes`` one, which costs
    several times the search (``find`` tells bytes from integers without raising)."""
    return data.find(part) != -1


#: The largest integer a parameter or a command's argument may carry (a signed 64-bit one):
#: what Kafka, JSON readers in other languages and the stores handle without surprises.
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)
#: The largest Kafka record a command's event may make (key, value and headers): librdkafka's
#: default ``message.max.bytes`` (1,000,000) less room for the record's framing. A larger one
#: would fail its whole transaction, and with it every command queued beside it.
MAX_EVENT_BYTES = 1_000_000 - 1_024
_DIGITS = re.compile(r"[0-9]{1,19}")
#: Stores keep their bookkeeping under keys starting with a NUL byte (the marks and cursors of
#: re-keyed and chained stores): no request may name one.
RESERVED_KEY_PREFIX = b"\x00"
RESERVED_KEYS = "such keys hold stores' bookkeeping"
Params = list[tuple[str, str]]


@dataclass(frozen=True)
class InputLimits:
    """How large the parts of a request may be (bytes, as sent or UTF-8 encoded).

    ``max_url_bytes``: path and query string (414); ``max_key_bytes``: a key or an aggregate
    id (400); ``max_name_bytes``: a store, aggregate or command name (400);
    ``max_body_bytes``: a command's or a batch lookup's body (413); ``max_json_depth``: arrays
    and objects nested in a body (400); ``max_batch_keys``: keys in one batch lookup (400);
    ``max_event_bytes``: the Kafka record of one event a command appends (413; keep it below
    the producer's ``message.max.bytes``).
    """

    max_url_bytes: int = 8 * 1024
    max_key_bytes: int = 4 * 1024
    max_name_bytes: int = 256
    max_body_bytes: int = 1024 * 1024
    max_json_depth: int = 32
    max_batch_keys: int = 10_000
    max_event_bytes: int = MAX_EVENT_BYTES

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")

    def check_url(self, raw_path: bytes, query_string: bytes) -> None:
        size = len(raw_path) + len(query_string)
        if size > self.max_url_bytes:
            raise InvalidRequest(
                f"the URL is {size} bytes long; at most {self.max_url_bytes}", status=414
            )

    def key(self, raw: bytes, what: str = "key") -> bytes:
        """The percent-decoded bytes of a key or aggregate id from a path segment."""
        key = unquote_to_bytes(raw) if has_bytes(raw, b"%") else raw
        utf8(key, what)
        if len(key) > self.max_key_bytes:
            raise InvalidRequest(
                f"the {what} is {len(key)} bytes long; at most {self.max_key_bytes}"
            )
        if key.startswith(RESERVED_KEY_PREFIX):
            raise InvalidRequest(f"a {what} starting with a NUL byte is reserved: {RESERVED_KEYS}")
        return key

    def name(self, raw: bytes, what: str) -> str:
        """A store, aggregate or command name from a path segment, percent-decoded."""
        name = unquote_to_bytes(raw) if has_bytes(raw, b"%") else raw
        if len(name) > self.max_name_bytes:
            raise InvalidRequest(
                f"the {what} is {len(name)} bytes long; at most {self.max_name_bytes}"
            )
        return utf8(name, what)

    def check_body_length(self, content_length: str | bytes | None) -> None:
        """413 when a request announces a body longer than :attr:`max_body_bytes`."""
        if content_length is None:
            return
        raw = (
            content_length.decode("latin-1")
            if isinstance(content_length, bytes)
            else content_length
        )
        raw = raw.strip()
        if not (raw.isascii() and raw.isdigit()):
            raise InvalidRequest(f"content-length must be a non-negative integer, got {raw[:40]!r}")
        if len(raw) > 19 or int(raw) > self.max_body_bytes:
            raise InvalidRequest(self.too_large(raw), status=413)

    def too_large(self, size: object) -> str:
        return f"the body is {size} bytes long; at most {self.max_body_bytes}"

    async def read_body(self, request: Request) -> bytes:
        """The request's body, read up to :attr:`max_body_bytes` (413 beyond), without ever
        holding more than that in memory."""
        self.check_body_length(request.headers.get("content-length"))
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise InvalidRequest(self.too_large(f"more than {size - len(chunk)}"), status=413)
            chunks.append(chunk)
        return b"".join(chunks)

    def load_json(self, body: bytes) -> Any:
        """``body`` parsed as JSON: integers within 64 bits, finite numbers only (no NaN or
        Infinity), arrays and objects nested at most :attr:`max_json_depth` deep."""
        try:
            # As json.loads(body, parse_int=..., ...), by one decoder (it would make one per call).
            value = _STRICT_JSON.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
        except RecursionError:
            raise InvalidRequest(
                f"malformed JSON: nested more than {self.max_json_depth} deep"
            ) from None
        except ValueError as exc:  # includes UnicodeDecodeError
            raise InvalidRequest(f"malformed JSON: {exc}") from None
        if depth_exceeds(value, self.max_json_depth):
            raise InvalidRequest(f"malformed JSON: nested more than {self.max_json_depth} deep")
        return value


def utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the {what} is not valid UTF-8: {exc}") from None


def query_params(query_string: bytes) -> Params:
    """The parameters of a query string, as Starlette decodes them."""
    if not query_string:
        return []
    return parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)


def count(
    name: str, raw: str | None, maximum: int = MAX_INT, *, alternative: str = ""
) -> int | None:
    """A non-negative integer parameter (ASCII digits only, at most ``maximum``); None when
    absent. Never converts more than 19 digits. ``alternative``: what else the parameter
    takes, said in the error."""
    if raw is None:
        return None
    text = raw.strip()
    if _DIGITS.fullmatch(text) is None or int(text) > maximum:
        shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
        raise InvalidRequest(
            f"{name} must be a non-negative integer (at most {maximum}){alternative}, got {shown!r}"
        )
    return int(text)


def last(params: Params, name: str) -> str | None:
    """The last value of ``name`` in ``params`` (as Starlette's ``query_params.get``)."""
    found = None
    for key, value in params:
        if key == name:
            found = value
    return found


def _json_int(text: str) -> int:
    if len(text) > 20 or not MIN_INT <= (value := int(text)) <= MAX_INT:
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} digits)"
        raise ValueError(f"integer {shown} is outside -2**63..2**63-1")
    return value


def _json_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is too large")
    return value


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT_JSON = json.JSONDecoder(
    parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant
)


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects in ``value`` nest more than ``limit`` deep (no recursion)."""
    level: list[Any] = [value]
    for _ in range(limit):
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                below.extend(item.values())
            elif isinstance(item, list):
                below.extend(item)
        if not below:
            return False
        level = below
    return any(isinstance(item, dict | list) for item in level)
