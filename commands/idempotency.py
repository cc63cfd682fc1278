"""Commands a client can retry safely: the ``Idempotency-Key`` a command is sent with, and the
header its events carry so that every later owner of the partition knows the key.

A command sent with a key (:class:`KeyedRequest`) carries on each of its event records the
header :data:`HEADER`: JSON naming the key, a fingerprint of the request (its aggregate, id,
command, arguments and expected version), the aggregate and command names, and the owner's
clock (epoch milliseconds) when it accepted the command. The header is the durable record of the
key, written in the same transaction as the events: the partition's owner indexes it
(:mod:`.key_index`), and a takeover that replays the events rebuilds the index from it.

Both the header and the key are untrusted input (from HTTP, from whoever may write the events
topic): they are bounded and validated, and a header that does not validate is ignored (the
record is replayed as an event, its key is not indexed).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from foldstream.domain import EventRecord
from foldstream.errors import FoldstreamError, InvalidRequest

#: The record header carrying a command's key (on each of its events).
HEADER = "foldstream-idempotency"
#: The HTTP header a client names a command with.
HTTP_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 128
#: What a key may hold: letters, digits and ``-._~+/=:`` (UUIDs, ULIDs, base64 all fit).
KEY_PATTERN = r"^[A-Za-z0-9\-._~+/=:]{1,128}$"
_KEY = re.compile(KEY_PATTERN)
#: The longest aggregate or command name a header may carry (the service's own names), and the
#: largest header a replay reads: anything larger is no header an owner wrote.
MAX_NAME = 1024
MAX_HEADER_BYTES = 4096
#: The header, as the OpenAPI document describes it.
IDEMPOTENCY_PARAMETER = {
    "name": HTTP_HEADER,
    "in": "header",
    "description": "names the command: resent with the same key (and request), it answers its "
    "first 200 and appends nothing more (docs/reference/http.md)",
    "schema": {"type": "string", "pattern": KEY_PATTERN, "maxLength": MAX_KEY_LENGTH},
}
_CANONICAL = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


class IdempotencyKeyReused(FoldstreamError):
    """An ``Idempotency-Key`` that named an applied command came with another request (HTTP
    422); nothing was appended.

    Remedy (client): a key names one request. Send a new command with a new key; retry a
    command only with its own key, its body, its expected version and its path unchanged.
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was used for {detail}: a key names one request. Nothing "
            "was appended; send a new command with a new key"
        )
        self.key = key


def idempotency_key(values: Sequence[str]) -> str | None:
    """The key of a request's ``Idempotency-Key`` headers (None: none sent); the structured
    field form (a quoted string) is taken too. :class:`InvalidRequest` (400) for more than one
    header, or a key that is empty, longer than :data:`MAX_KEY_LENGTH` or holds other
    characters than :data:`KEY_PATTERN` allows."""
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest(f"send one {HTTP_HEADER} header, not {len(values)}")
    key = values[0].strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not _KEY.fullmatch(key):
        shown = key[:40] + ("..." if len(key) > 40 else "")
        raise InvalidRequest(
            f"{HTTP_HEADER} {shown!r} is not a key: 1 to {MAX_KEY_LENGTH} letters, digits or "
            "-._~+/=: (a UUID fits)"
        )
    return key


@dataclass(frozen=True)
class KeyedRequest:
    """A command sent with ``key``: what it targets, and ``request``, a fingerprint (SHA-256,
    hex) of everything the request says."""

    key: str
    request: str
    aggregate: str
    aggregate_id: str
    command: str

    @classmethod
    def of(
        cls,
        key: str,
        aggregate: str,
        aggregate_id: str,
        command: str,
        arguments: Any,
        expected_version: int | None,
    ) -> KeyedRequest:
        """The keyed request; ``arguments`` is the decoded JSON body (its object keys' order
        does not change the fingerprint)."""
        described = [aggregate, aggregate_id, command, arguments, expected_version]
        digest = hashlib.sha256(_CANONICAL.encode(described).encode()).hexdigest()
        return cls(key, digest, aggregate, aggregate_id, command)

    def header(self, at: int) -> bytes:
        """The record header of this command's events, accepted at ``at`` (epoch ms)."""
        fields = {
            "key": self.key,
            "request": self.request,
            "aggregate": self.aggregate,
            "command": self.command,
            "at": at,
        }
        return _CANONICAL.encode(fields).encode()

    def conflict(self, aggregate: str, aggregate_id: str, command: str) -> str:
        """How this request differs from the one the key named first (a detail of
        :class:`IdempotencyKeyReused`)."""
        if (aggregate, aggregate_id, command) == (
            self.aggregate,
            self.aggregate_id,
            self.command,
        ):
            return f"{command} on {aggregate} {aggregate_id!r} with other arguments or version"
        return f"{command} on {aggregate} {aggregate_id[:200]!r}"


class KeyHeader(BaseModel):
    """The :data:`HEADER` of a record, validated: what a replay indexes."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    key: str = Field(pattern=KEY_PATTERN)
    request: str = Field(pattern=r"^[0-9a-f]{64}$")
    aggregate: str = Field(min_length=1, max_length=MAX_NAME)
    command: str = Field(min_length=1, max_length=MAX_NAME)
    at: int = Field(ge=0, le=2**53)


def key_header(record: EventRecord) -> KeyHeader | None:
    """The validated key header of ``record``; None when it has none, or one that does not
    validate (then its key is not indexed: the record is still an event)."""
    raw = record.header(HEADER)
    if raw is None or len(raw) > MAX_HEADER_BYTES:
        return None
    try:
        return KeyHeader.model_validate_json(raw)
    except ValidationError:
        return None


def with_key(record: EventRecord, header: bytes) -> EventRecord:
    """``record`` carrying the key ``header``."""
    return record._replace(headers=(*record.headers, (HEADER, header)))
