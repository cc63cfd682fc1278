"""What the index of a partition's keyed commands keeps (:mod:`.key_index`): its entries and
bookkeeping as stored, and a keyed command on its way (:class:`Stamp`).

Store layout (keys that are not UTF-8, so no aggregate id can take them):

- ``\\xff\\xfeidempotency/k/<key>``: the entry (:class:`Entry`, JSON);
- ``\\xff\\xfeidempotency/n/<sequence number>``: the key of the entry so numbered;
- ``\\xff\\xfeidempotency/meta``: the next sequence number, the oldest one not deleted, the
  horizon (:class:`Meta`).

Entries are read back from the store, which a changelog anyone may write fills: they are
validated (pydantic) and bounded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from foldstream.commands.idempotency import MAX_KEY_LENGTH, MAX_NAME, KeyedRequest
from foldstream.commands.snapshot_store import MAX_SNAPSHOT_BYTES

PREFIX = b"\xff\xfeidempotency/"
META_KEY = PREFIX + b"meta"
#: Entries a write deletes at most beyond the number it adds (the rest go with later writes).
EXPIRE_PER_WRITE = 1_000
#: The largest entry kept: as large as a snapshot, one changelog record.
MAX_ENTRY_BYTES = MAX_SNAPSHOT_BYTES
#: How far past this instance's clock a replayed key's time may move the horizon: a record
#: claiming a far later time (forged, or from a clock gone wrong) would expire every key.
FUTURE_SLACK_MS = 3_600_000


@dataclass(frozen=True)
class Retention:
    """How long (``seconds``) and how many (``max_keys`` per partition) keyed commands are
    remembered (see the module)."""

    seconds: float = 86_400.0
    max_keys: int = 100_000


class Entry(BaseModel):
    """A keyed command the partition holds: its key and request fingerprint, what it targeted,
    its time (epoch ms), its sequence number, the offset of its last event and the events its
    answer listed."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    key: str = Field(max_length=MAX_KEY_LENGTH)
    request: str = Field(max_length=64)
    aggregate: str = Field(max_length=MAX_NAME)
    aggregate_id: str  # bounded by the entry's size
    command: str = Field(max_length=MAX_NAME)
    at: int
    seq: int = Field(ge=0)
    offset: int = Field(ge=0)
    events: list[dict[str, Any]]


class Meta(BaseModel):
    """The index's bookkeeping: ``next`` sequence number, the oldest one not deleted
    (``first``), and the ``horizon`` (epoch ms)."""

    next: int = Field(default=0, ge=0)
    first: int = Field(default=0, ge=0)
    horizon: int = 0


@dataclass
class Stamp:
    """A keyed command on its way to the log: its request, its time (epoch ms), the events its
    answer lists, its record header, and ``done``, resolved once its transaction ended."""

    request: KeyedRequest
    at: int
    events: list[dict[str, Any]]
    header: bytes
    done: asyncio.Future[None] | None = None


class Values(Protocol):
    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...


class Writable(Protocol):
    def write(self, changes: dict[bytes, bytes | None], offset: int) -> None: ...


class MemoryValues:
    """The index's values without an aggregate store."""

    def __init__(self) -> None:
        self._values: dict[bytes, bytes] = {}

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return [self._values.get(k) for k in keys]

    def write(self, changes: dict[bytes, bytes | None]) -> None:
        for key, value in changes.items():
            if value is None:
                self._values.pop(key, None)
            else:
                self._values[key] = value


@dataclass
class IndexWrite:
    """The entries one write adds, the keys whose entries it deletes, and the bookkeeping
    after it."""

    entries: list[Entry]
    dropped: set[str]
    meta: Meta


def entry_key(key: str) -> bytes:
    return PREFIX + b"k/" + key.encode()


def order_key(seq: int) -> bytes:
    return PREFIX + b"n/" + str(seq).encode()


def entry_of(stamp: Stamp, seq: int, offset: int) -> Entry:
    keyed = stamp.request
    return Entry(
        key=keyed.key,
        request=keyed.request,
        aggregate=keyed.aggregate,
        aggregate_id=keyed.aggregate_id,
        command=keyed.command,
        at=stamp.at,
        seq=seq,
        offset=offset,
        events=stamp.events,
    )


def resolve(done: asyncio.Future[None]) -> None:
    """Resolve ``done`` from any thread (a revoke closes the index outside the event loop)."""

    def settle() -> None:
        if not done.done():
            done.set_result(None)

    loop = done.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        settle()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(settle)
