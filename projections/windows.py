"""Windowed aggregates: a fold per key and time window, by event time, read by
``GET /stores/{store}/keys/{key}/windows``.

A record's event time is its domain event's timestamp, or (another producer's topic) the Kafka
record's timestamp, or what ``timestamp(record)`` gives. It falls into one window
(tumbling: ``advance`` None) or several (hopping: windows of ``size`` starting every
``advance``), aligned on the epoch. Each partition keeps its *stream time*, the largest event
time it has seen. A window is *closed* once ``end + grace <= stream time``: a record whose
windows are all closed is *late*, dropped and counted
(``foldstream_projection_late_records_total``); a record is added to those of its windows that
are still open. A window is deleted once ``end + retention <= stream time`` (so ``retention``
is at least ``grace``): found through a time-ordered index, never by reading the other windows,
and deleted from the changelog too. Windows past retention whose deletion is still to come are
not answered either.

Windows, their index and the stream time are all stored keys
(:mod:`foldstream.state.ordered_keys`), written in the same batch as the source offset and
copied by the changelog: a standby that takes over goes on with the same stream time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from foldstream.domain.records import HEADER_TIMESTAMP, EventCodec, EventRecord
from foldstream.errors import ConfigurationError
from foldstream.kafka import Partitioner
from foldstream.projections.ordered import (
    ChunkFolded,
    OrderedStore,
    Records,
    check_store,
    routing_key,
)
from foldstream.projections.projection import ErrorPolicy, Fold, StoreKind
from foldstream.state.base import PartitionWriter
from foldstream.state.ordered_keys import (
    EXPIRY,
    STREAM_TIME,
    decode_int,
    encode_int,
    entry_prefix,
    expiry_end,
    expiry_key,
    window_key,
    window_of_expiry,
)
from foldstream.times import Time, iso_to_ms, to_epoch_ms

_compact_json = json.JSONEncoder(separators=(",", ":")).encode
_MS = timedelta(milliseconds=1)
#: Windows one record may fall into (``size`` / ``advance``), and the longest window, grace
#: or retention: bounds that keep every window's time within 64 bits and a record's work small.
MAX_WINDOWS_PER_RECORD = 1000
MAX_SPAN = timedelta(days=366 * 1000)
#: Windows a chunk deletes at most: the rest go with the next chunks (they are not answered
#: meanwhile), so a jump in stream time never makes one huge batch.
EXPIRE_PER_CHUNK = 10_000


@dataclass(frozen=True)
class WindowedAggregate(OrderedStore):
    """``fold(state, event)`` per key and window of ``size`` (``advance``: hopping windows),
    over ``topic`` (None: the service's domain events, which ``fold`` gets decoded; otherwise
    :class:`~foldstream.domain.records.EventRecord` s, tombstones left out). Returning None
    deletes the window. See the module docstring for ``grace`` and ``retention``."""

    kind: ClassVar[StoreKind] = "windowed"

    store: str
    fold: Fold
    size: timedelta
    grace: timedelta = timedelta(minutes=1)
    retention: timedelta = timedelta(days=1)
    advance: timedelta | None = None
    topic: str | None = None
    timestamp: Callable[[EventRecord], Time] | None = None
    partitioner: Partitioner = "murmur2"
    on_error: ErrorPolicy = "dead-letter"
    version: int = 1
    _codec: EventCodec = field(default_factory=EventCodec, repr=False, compare=False)

    #: size, advance, grace and retention in milliseconds (every record uses them).
    _spans_ms: tuple[int, int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_store(self, self.topic)
        for name in ("size", "grace", "retention", "advance"):
            span = getattr(self, name)
            if span is None:
                continue
            if (
                not isinstance(span, timedelta)
                or span % _MS
                or not timedelta(0) <= span <= MAX_SPAN
            ):
                raise ConfigurationError(
                    f"store {self.store!r}: {name} must be a timedelta of whole milliseconds, "
                    f"0 to {MAX_SPAN.days} days, not {span!r}"
                )
        size = self.size // _MS
        advance = size if self.advance is None else self.advance // _MS
        spans = (size, advance, self.grace // _MS, self.retention // _MS)
        object.__setattr__(self, "_spans_ms", spans)
        if self.size_ms <= 0 or advance <= 0 or advance > self.size_ms:
            raise ConfigurationError(
                f"store {self.store!r}: size and advance must be positive, advance at most size"
            )
        if -(-self.size_ms // advance) > MAX_WINDOWS_PER_RECORD:
            raise ConfigurationError(
                f"store {self.store!r}: size / advance would put a record in more than "
                f"{MAX_WINDOWS_PER_RECORD} windows"
            )
        if self.retention < self.grace:
            raise ConfigurationError(
                f"store {self.store!r}: retention must be at least grace (a window must exist "
                "for as long as it takes records)"
            )

    @property
    def size_ms(self) -> int:
        return self._spans_ms[0]

    @property
    def advance_ms(self) -> int:
        return self._spans_ms[1]

    @property
    def grace_ms(self) -> int:
        return self._spans_ms[2]

    @property
    def retention_ms(self) -> int:
        return self._spans_ms[3]

    def source_topic(self, events_topic: str) -> str:
        return events_topic if self.topic is None else self.topic

    def event_time(self, record: EventRecord) -> int:
        """The event time of ``record``, epoch milliseconds (ValueError if it has none)."""
        if self.timestamp is not None:
            return to_epoch_ms(self.timestamp(record))
        if self.topic is None:
            stamp = record.header(HEADER_TIMESTAMP)
            if stamp is None:
                raise ValueError(f"event {record.key!r} has no {HEADER_TIMESTAMP!r} header")
            return iso_to_ms(stamp.decode())
        if record.timestamp is None or record.timestamp < 0:
            raise ValueError(f"record {record.key!r} has no timestamp")
        return to_epoch_ms(record.timestamp)

    def window_starts(self, time_ms: int) -> list[int]:
        """The starts of the windows ``time_ms`` falls into, oldest first."""
        size, advance = self._spans_ms[:2]
        if advance == size:  # tumbling: one window
            return [time_ms - time_ms % size]
        last = time_ms - time_ms % advance
        first = last - (size - 1) // advance * advance
        return [s for s in range(first, last + 1, advance) if s + size > time_ms]

    def read_keys(self, records: Records) -> list[bytes]:
        # Run by every task on every chunk before it folds (the fold does not need it when
        # it runs beside the store): kept lean, a record's prefix made once per key.
        keys: dict[bytes, None] = {STREAM_TIME: None}
        prefixes: dict[bytes, bytes] = {}
        size, advance = self._spans_ms[:2]
        for _, record in records:
            key = record.key
            try:
                time_ms = self.event_time(record)
            except (ValueError, TypeError):
                continue  # no time: the fold raises it for this record
            if key is None:
                continue  # no key: the same
            prefix = prefixes.get(key)
            if prefix is None:
                prefix = prefixes[key] = entry_prefix(key)
            if advance == size:
                keys[prefix + encode_int(time_ms - time_ms % size)] = None
            else:
                for start in self.window_starts(time_ms):
                    keys[prefix + encode_int(start)] = None
        return list(keys)

    def fold_chunk(self, writer: PartitionWriter, records: Records) -> ChunkFolded:
        changed: dict[bytes, bytes | None] = {}
        stored_time = writer.get(STREAM_TIME)
        stream = None if stored_time is None else decode_int(stored_time)
        late = 0
        for _, record in records:
            if self.topic is not None and record.value is None:
                continue  # a tombstone carries nothing to aggregate
            key = routing_key(record)
            time_ms = self.event_time(record)
            stream = time_ms if stream is None else max(stream, time_ms)
            closes = self.size_ms + self.grace_ms
            starts = [s for s in self.window_starts(time_ms) if s + closes > stream]
            if not starts:
                late += 1
                continue
            event = self.event_of(record)
            for start in starts:
                self._fold_window(writer, key, start, event, changed)
        if stream is not None and (encoded := encode_int(stream)) != stored_time:
            writer.put(STREAM_TIME, encoded)
            changed[STREAM_TIME] = encoded
            self._expire(writer, stream, changed)
        return ChunkFolded(changed, late)

    def _fold_window(
        self,
        writer: PartitionWriter,
        key: bytes,
        start: int,
        event: Any,
        changed: dict[bytes, bytes | None],
    ) -> None:
        stored = window_key(key, start)
        current = writer.get(stored)
        state = self.fold(None if current is None else json.loads(current), event)
        index = expiry_key(start, key)
        if state is None:
            if current is not None:
                for deleted in (stored, index):
                    writer.delete(deleted)
                    changed[deleted] = None
            return
        if current is None:
            writer.put(index, b"")
            changed[index] = b""
        changed[stored] = value = _compact_json(state).encode()
        writer.put(stored, value)

    def _expire(
        self, writer: PartitionWriter, stream: int, changed: dict[bytes, bytes | None]
    ) -> None:
        """Delete (up to :data:`EXPIRE_PER_CHUNK`) windows past retention at ``stream``."""
        first_kept = self.first_kept_start(stream)
        for index, _ in writer.scan(EXPIRY, expiry_end(first_kept), EXPIRE_PER_CHUNK):
            for deleted in (index, window_of_expiry(index)):
                writer.delete(deleted)
                changed[deleted] = None

    def first_kept_start(self, stream: int) -> int:
        """The earliest window start still within retention at stream time ``stream``: a
        window is deleted once ``start + size + retention <= stream``."""
        return stream - self.size_ms - self.retention_ms + 1
