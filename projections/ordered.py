"""Ordered stores: entries under a routing key (the record's key, which decides its partition),
sorted by a sort key, read by ranges (``GET /stores/{store}/keys/{key}/range``).

``OrderedProjection(store, entry=...)`` keeps an entry per record: ``entry(record)`` gives its
sort key and value (or None to keep nothing). Entries are stored in the ``ordered/1`` format
(:mod:`foldstream.state.ordered_keys`): records with equal sort keys under one routing key are
all kept, in the order they were written; a tombstone (a record without a value, on a topic of
another producer) deletes every entry of its key.
"""

from __future__ import annotations

import dataclasses
import json
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from foldstream.domain.records import EventCodec, EventRecord
from foldstream.errors import ConfigurationError
from foldstream.kafka import PARTITIONERS, Partitioner
from foldstream.projections.projection import (
    ErrorPolicy,
    Projection,
    StoreKind,
    check_declaration,
)
from foldstream.state.base import PartitionWriter
from foldstream.state.format import ORDERED_FORMAT
from foldstream.state.ordered_keys import (
    SORT_KEY_TYPES,
    SortKeyType,
    encode_sort_key,
    entry_key,
    entry_prefix,
    prefix_end,
)
from foldstream.times import to_epoch_ms

_compact_json = json.JSONEncoder(separators=(",", ":")).encode
Records = Sequence[tuple[int, EventRecord]]
#: Entries deleted per range read when a tombstone clears a routing key.
_DELETE_PAGE = 1000

Entry = Callable[[Any], "tuple[Any, Any] | None"]
"""``(record or event) -> (sort key, value) | None``."""


class ChunkFolded(NamedTuple):
    """What folding a chunk of records changed: ``{stored key: new value | None (deleted)}``,
    and how many records were dropped as late (windowed stores)."""

    changed: dict[bytes, bytes | None]
    late: int = 0


class OrderedStore(Projection):
    """A projection whose store is kept in the ordered format: a record may change several
    stored keys (entries, windows), so a chunk of records is folded at once
    (:meth:`fold_chunk`) rather than key by key (:meth:`apply`)."""

    kind: ClassVar[StoreKind] = "ordered"

    @property
    def table_format(self) -> str:
        return ORDERED_FORMAT

    def event_of(self, record: EventRecord) -> Any:
        """What the store's function gets for ``record``: the record itself (another
        producer's topic), or the domain event it carries, decoded with the service's codec."""
        if getattr(self, "topic", None) is not None:
            return record
        codec: EventCodec = getattr(self, "_codec")  # noqa: B009 - a field of the subclasses
        return codec.decode(record)

    def for_events(self, codec: EventCodec) -> Projection:
        if getattr(self, "topic", None) is not None:
            return self  # another producer's records: nothing to decode
        return dataclasses.replace(self, _codec=codec)  # type: ignore[type-var]

    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        raise TypeError(f"store {self.store!r} is {self.kind}: its records are folded by chunk")

    @abstractmethod
    def fold_chunk(self, writer: PartitionWriter, records: Records) -> ChunkFolded:
        """Fold ``records`` (``(offset, record)`` of one partition, offset order) into
        ``writer``, uncommitted."""


def check_store(projection: Projection, topic: str | None) -> None:
    """The checks every projection's declaration gets: its name, its topic, its partitioner."""
    check_declaration(projection)
    store = projection.store
    if topic is not None and not topic:
        raise ConfigurationError(f"store {store!r}: topic must be a topic's name or None")
    if projection.partitioner not in PARTITIONERS:
        raise ConfigurationError(
            f"partitioner must be one of {PARTITIONERS}, not {projection.partitioner!r}"
        )


def stored_json(value: Any) -> bytes:
    """``value`` as the JSON bytes a store keeps: bytes that are JSON as they are (other bytes
    as a JSON string of their text), anything else JSON-encoded."""
    if isinstance(value, bytes | bytearray):
        try:
            json.loads(value)
        except ValueError:
            return json.dumps(bytes(value).decode("utf-8", errors="replace")).encode()
        return bytes(value)
    return _compact_json(value).encode()


def routing_key(record: EventRecord) -> bytes:
    if record.key is None:
        raise ValueError("a record without a key has no place in an ordered store")
    return record.key


@dataclass(frozen=True)
class OrderedProjection(OrderedStore):
    """Every record of ``topic`` (None: the service's domain events) as an entry under its key,
    sorted by the sort key that ``entry`` gives with the value, e.g.
    ``lambda record: (json.loads(record.value)["booked_at"], record.value)``.

    ``entry`` gets the decoded domain event (events), or the
    :class:`~foldstream.domain.records.EventRecord` (another producer's topic); it returns
    ``(sort key, value)`` or None to keep nothing. ``sort_key`` is the sort key's type:
    ``"time"`` (ISO-8601 text, epoch milliseconds or a datetime), ``"int"`` (64-bit) or
    ``"string"``. The value is JSON-encoded, or kept as it is when it is bytes holding JSON.
    """

    store: str
    entry: Entry
    topic: str | None = None
    sort_key: SortKeyType = "time"
    partitioner: Partitioner = "murmur2"
    on_error: ErrorPolicy = "dead-letter"
    version: int = 1
    _codec: EventCodec = field(default_factory=EventCodec, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_store(self, self.topic)
        if self.sort_key not in SORT_KEY_TYPES:
            raise ConfigurationError(
                f"sort_key must be one of {SORT_KEY_TYPES}, not {self.sort_key!r}"
            )

    def source_topic(self, events_topic: str) -> str:
        return events_topic if self.topic is None else self.topic

    def read_keys(self, records: Records) -> list[bytes]:
        return []  # entries are written, never read, by the fold

    def sort_bytes(self, sort_key: Any) -> bytes:
        """``sort_key`` of this store's type, encoded (ValueError if it is not one)."""
        if self.sort_key == "time":
            return encode_sort_key("time", to_epoch_ms(sort_key))
        return encode_sort_key(self.sort_key, sort_key)

    def fold_chunk(self, writer: PartitionWriter, records: Records) -> ChunkFolded:
        changed: dict[bytes, bytes | None] = {}
        for offset, record in records:
            key = routing_key(record)
            if record.value is None:
                if self.topic is not None:
                    _delete_all(writer, key, changed)
                continue
            given = self.entry(self.event_of(record))
            if given is None:
                continue
            sort_key, value = given
            stored = entry_key(key, self.sort_bytes(sort_key), offset)
            changed[stored] = stored_json(value)
            writer.put(stored, changed[stored])  # type: ignore[arg-type]
        return ChunkFolded(changed)


def _delete_all(writer: PartitionWriter, key: bytes, changed: dict[bytes, bytes | None]) -> None:
    start = entry_prefix(key)
    end = prefix_end(start)
    while page := writer.scan(start, end, _DELETE_PAGE):
        for stored, _ in page:
            writer.delete(stored)
            changed[stored] = None
        start = page[-1][0] + b"\x00"


def field_entry(name: str) -> Entry:
    """The ``entry`` of a store of JSON records from another producer: the record's value as
    it is, sorted by its top-level field ``name`` (ValueError for a record without it)."""

    def entry(record: EventRecord) -> tuple[Any, bytes]:
        document = json.loads(record.value or b"null")
        if not isinstance(document, dict) or name not in document:
            raise ValueError(f"record {record.key!r} is no JSON object with a {name!r} field")
        return document[name], record.value  # type: ignore[return-value]

    return entry
