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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    MapperDeserialisationError,
    UUIDAsHex,
    find_id_convertor,
)
from eventsourcing.utils import resolve_topic

HEADER_TYPE = "event-type"
HEADER_VERSION = "version"
HEADER_ID = "event-id"
HEADER_TIMESTAMP = "timestamp"


class EventRecord(NamedTuple):
    """A Kafka record: key, value (None for a tombstone), headers and timestamp (epoch
    milliseconds, None when the record has none).

    A named tuple: projections build one per record, and a frozen dataclass costs ~8× more.
    """

    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int | None = None

    @classmethod
    def from_message(cls, message: Any) -> EventRecord:
        """The record a consumer's message holds: anything with ``key()``, ``value()``,
        ``headers()`` (None when it has none) and ``timestamp()``, as confluent-kafka's
        messages."""
        headers = message.headers()
        return cls(
            message.key(),
            message.value(),
            tuple(headers) if headers else (),
            kafka_timestamp(message.timestamp()),
        )

    def header(self, name: str) -> bytes | None:
        for header_name, value in self.headers:
            if header_name == name:
                return value
        return None


def kafka_timestamp(stamp: tuple[int, int]) -> int | None:
    """A record's timestamp in milliseconds from confluent-kafka's ``(type, value)``; None
    when it has none (type 0: not available)."""
    kind, value = stamp
    return value if kind else None


@dataclass(frozen=True)
class _EventClass:
    """What decoding needs to know about one event topic, resolved once."""

    cls: type
    convert_id: Callable[[str], Any]
    class_version: int


class EventCodec:
    """Converts domain events to :class:`EventRecord` and back (eventsourcing's ``Mapper``)."""

    def __init__(self) -> None:
        transcoder = JSONTranscoder()
        for transcoding in (UUIDAsHex(), DatetimeAsISO(), DecimalAsStr()):
            transcoder.register(transcoding)
        self._transcoder = transcoder
        self._mapper: Mapper[Any] = Mapper(transcoder=transcoder)
        self._classes: dict[bytes, _EventClass] = {}

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
        """The domain event of ``record`` (upcast to its class's current version).

        The same steps as eventsourcing's ``Mapper.to_domain_event`` (the same transcoder,
        id conversion, upcasting and construction), with the topic's class, id convertor and
        version resolved once per topic instead of per event: projections decode every event.
        """
        topic = version = None
        for name, value in record.headers:
            if name == HEADER_TYPE:
                topic = value
            elif name == HEADER_VERSION:
                version = value
        if topic is None or version is None or record.value is None:
            raise ValueError(
                f"record with key {record.key!r} is not a foldstream event: "
                f"headers {HEADER_TYPE!r} and {HEADER_VERSION!r} are required"
            )
        event_class = self._classes.get(topic) or self._resolve(topic)
        try:
            state: dict[str, Any] = self._transcoder.decode(record.value)
        except Exception as exc:
            raise MapperDeserialisationError(
                f"cannot decode event {topic.decode()!r} of {record.key!r} "
                f"version {version.decode()}: {exc}"
            ) from exc
        state["originator_id"] = event_class.convert_id(record.key.decode())
        state["originator_version"] = int(version)
        from_version = state.pop("class_version", 1)
        while from_version < event_class.class_version:
            getattr(event_class.cls, f"upcast_v{from_version}_v{from_version + 1}")(state)
            from_version += 1
        domain_event: Any = object.__new__(event_class.cls)
        object.__setattr__(domain_event, "__dict__", state)
        return domain_event

    def _resolve(self, topic: bytes) -> _EventClass:
        cls = resolve_topic(topic.decode())
        resolved = _EventClass(
            cls=cls,
            convert_id=find_id_convertor(cls, str),
            class_version=getattr(cls, "class_version", 1),
        )
        self._classes[topic] = resolved
        return resolved
