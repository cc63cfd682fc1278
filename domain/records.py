"""How domain events map to Kafka records, and back.

=====================  ==============================================================
Kafka record           from the domain event
=====================  ==============================================================
key                    the aggregate id, UTF-8 (``str(id)`` for UUID-keyed aggregates)
value                  the event's attributes as JSON (eventsourcing's ``JSONTranscoder``;
                       ``class_version`` is included when it is above 1)
header ``event-type``  the event class's topic (``package.module:Class.Event``)
header ``version``     the originator version (ASCII decimal)
header ``event-id``    a UUID unique to the event (ASCII hex)
header ``timestamp``   the event's timestamp (ISO 8601)
=====================  ==============================================================

Old events are upcast on the way in with eventsourcing's ``class_version`` and
``upcast_vX_vY`` static methods on the event class.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    StoredEvent,
    UUIDAsHex,
)

HEADER_TYPE = "event-type"
HEADER_VERSION = "version"
HEADER_ID = "event-id"
HEADER_TIMESTAMP = "timestamp"


@dataclass(frozen=True)
class EventRecord:
    """A Kafka record: key, value (None for a tombstone) and headers."""

    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def header(self, name: str) -> bytes | None:
        for header_name, value in self.headers:
            if header_name == name:
                return value
        return None


class EventCodec:
    """Converts domain events to :class:`EventRecord` and back (eventsourcing's ``Mapper``)."""

    def __init__(self) -> None:
        transcoder = JSONTranscoder()
        for transcoding in (UUIDAsHex(), DatetimeAsISO(), DecimalAsStr()):
            transcoder.register(transcoding)
        self._mapper: Mapper[Any] = Mapper(transcoder=transcoder)

    def encode(self, domain_event: Any) -> EventRecord:
        stored = self._mapper.to_stored_event(domain_event)
        timestamp = getattr(domain_event, "timestamp", None)
        headers = [
            (HEADER_TYPE, stored.topic.encode()),
            (HEADER_VERSION, str(stored.originator_version).encode()),
            (HEADER_ID, uuid.uuid4().hex.encode()),
        ]
        if timestamp is not None:
            headers.append((HEADER_TIMESTAMP, timestamp.isoformat().encode()))
        return EventRecord(
            key=str(stored.originator_id).encode(), value=stored.state, headers=tuple(headers)
        )

    def decode(self, record: EventRecord) -> Any:
        """The domain event of ``record`` (upcast to its class's current version)."""
        topic = record.header(HEADER_TYPE)
        version = record.header(HEADER_VERSION)
        if topic is None or version is None or record.value is None:
            raise ValueError(
                f"record with key {record.key!r} is not a foldstream event: "
                f"headers {HEADER_TYPE!r} and {HEADER_VERSION!r} are required"
            )
        originator_id: UUID | str = record.key.decode()
        stored = StoredEvent(
            originator_id=originator_id,
            originator_version=int(version),
            topic=topic.decode(),
            state=record.value,
        )
        return self._mapper.to_domain_event(stored)
