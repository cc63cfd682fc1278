"""Consistency tokens: read-your-writes across the command and query sides.

A command's 200 answer carries a token: the position of its last event in the events topic (the
partition and offset), bound to the topic's name by a checksum. A query that sends it back
(``?consistent_with=TOKEN`` or the header ``Foldstream-Consistent-With: TOKEN``) is answered
only with state that includes that event (:mod:`foldstream.query_api.answers`).

Tokens are opaque to clients: ``f1-<partition>-<offset>-<checksum>``, where the checksum is the
CRC-32 of the topic's name, the partition and the offset. What comes back is untrusted input:
it is parsed strictly (at most :data:`MAX_TOKEN_BYTES`, exactly that shape, numbers within
bounds) and anything else is a 400. The checksum is no secret and no signature: a client can
forge a token for a far-away offset, and then waits at most ``consistency_wait_ms`` for a 503,
like any client asking for data that is not there yet.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from foldstream.errors import InvalidRequest
from foldstream.http_input import MAX_INT

#: The query parameter and the header (lower case, as ASGI gives it) that carry a token.
PARAM = "consistent_with"
HEADER = b"foldstream-consistent-with"
MAX_TOKEN_BYTES = 64
_VERSION = "f1"
_SHAPE = re.compile(r"f1-(0|[1-9][0-9]{0,8})-(0|[1-9][0-9]{0,18})-([0-9a-f]{8})")


@dataclass(frozen=True)
class Token:
    """A position in a topic: ``partition`` and ``offset``, with the ``checksum`` binding it
    to the topic's name."""

    partition: int
    offset: int
    checksum: str

    def of(self, topic: str) -> bool:
        """Whether the token is a position of ``topic``."""
        return self.checksum == _checksum(topic, self.partition, self.offset)


def _checksum(topic: str, partition: int, offset: int) -> str:
    position = f"{topic}\0{partition}\0{offset}".encode()
    return f"{zlib.crc32(position):08x}"


def token_for(topic: str, partition: int, offset: int) -> str:
    """The token of the record at ``offset`` of ``partition`` of ``topic``."""
    return f"{_VERSION}-{partition}-{offset}-{_checksum(topic, partition, offset)}"


def parse_token(raw: str | bytes) -> Token:
    """The token ``raw`` holds; :class:`InvalidRequest` (a 400) for anything else."""
    if len(raw) > MAX_TOKEN_BYTES:
        raise InvalidRequest(f"{PARAM}: a token is at most {MAX_TOKEN_BYTES} bytes long")
    text = raw.decode("ascii", errors="replace") if isinstance(raw, bytes) else raw
    found = _SHAPE.fullmatch(text)
    if found is None:
        raise InvalidRequest(
            f"{PARAM}: not a consistency token; send back the 'token' of a command's answer "
            "as it is"
        )
    offset = int(found.group(2))
    if offset > MAX_INT:
        raise InvalidRequest(f"{PARAM}: the token's offset is out of range")
    return Token(int(found.group(1)), offset, found.group(3))
