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

Decoding resolves ``event-type`` only against the event classes of the aggregates the codec was
made for (and topics registered with eventsourcing's ``register_topic`` for one of them): a
record naming any other type is :class:`~foldstream.errors.UndecodableRecord`, and nothing is
ever imported to resolve it. A producer writing to the topic cannot make a reader load a
module.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from eventsourcing import utils as eventsourcing_utils
from eventsourcing.domain import CanMutateAggregate
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    UUIDAsHex,
    find_id_convertor,
)
from eventsourcing.utils import get_topic

from foldstream.errors import UndecodableRecord

HEADER_TYPE = "event-type"
HEADER_VERSION = "version"
HEADER_ID = "event-id"
HEADER_TIMESTAMP = "timestamp"


class EventRecord(NamedTuple):
    """A Kafka record: key, value (None for a tombstone), headers and timestamp (epoch
    milliseconds, None when the record has none).

    A named tuple: projections build one per record, and a frozen dataclass costs several
    times more to build.
    """

    key: bytes | None  # None when its producer sent none (never for foldstream's events)
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


def event_classes(aggregates: Iterable[type]) -> dict[str, type]:
    """``{topic: event class}`` of every event class of ``aggregates``: the classes nested in
    each aggregate class and its bases (``Product.Created``, ``Product.ShipmentReceived``...),
    which eventsourcing makes for every ``@event`` of the aggregate."""
    found: dict[str, type] = {}
    for aggregate in aggregates:
        for owner in aggregate.__mro__:
            for member in vars(owner).values():
                if isinstance(member, type) and issubclass(member, CanMutateAggregate):
                    found[get_topic(member)] = member
    return found


def _registered(topic: str) -> object:
    """What ``topic`` was registered for with eventsourcing's ``register_topic`` (or resolved
    to before), without resolving it: a dictionary lookup, never an import."""
    cache: Mapping[str, object] = getattr(eventsourcing_utils, "_topic_cache", {})
    return cache.get(topic)


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
    required: frozenset[str]  # fields without a default, which the record's JSON must hold


_ENVELOPE = frozenset({"originator_id", "originator_version"})  # from the key and headers


def json_transcoder() -> JSONTranscoder:
    """eventsourcing's JSON transcoder with the transcodings events (and snapshots) use:
    UUIDs as hex, datetimes as ISO 8601, decimals as strings."""
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DatetimeAsISO(), DecimalAsStr()):
        transcoder.register(transcoding)
    return transcoder


class EventCodec:
    """Converts domain events to :class:`EventRecord` and back (eventsourcing's ``Mapper``).

    ``aggregates`` are the aggregate classes whose events :meth:`decode` accepts (a
    :class:`~foldstream.service.Service` makes its codec with its own); encoding takes any.
    """

    def __init__(self, aggregates: Iterable[type] = ()) -> None:
        transcoder = json_transcoder()
        self._transcoder = transcoder
        self._mapper: Mapper[Any] = Mapper(transcoder=transcoder)
        owners = tuple(aggregates)
        self._events = event_classes(owners)
        self._event_set = frozenset(self._events.values())
        self._owners = frozenset(owners)
        self._owner_topics = frozenset(get_topic(cls) for cls in owners)
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
        Raises :class:`~foldstream.errors.UndecodableRecord` for a record that is not an event
        of the codec's aggregates; errors of upcasting (user code) are raised as they are.
        """
        topic = version = None
        for name, value in record.headers:
            if name == HEADER_TYPE:
                topic = value
            elif name == HEADER_VERSION:
                version = value
        if topic is None or version is None or record.value is None or record.key is None:
            raise UndecodableRecord(
                f"record with key {record.key!r} is not a foldstream event: a key, a value and "
                f"headers {HEADER_TYPE!r} and {HEADER_VERSION!r} are required"
            )
        event_class = self._classes.get(topic) or self._resolve(topic)
        try:
            state: dict[str, Any] = self._transcoder.decode(record.value)
            if not isinstance(state, dict):
                raise TypeError(f"the value is JSON {type(state).__name__}, not an object")
            state["originator_id"] = event_class.convert_id(record.key.decode())
            state["originator_version"] = int(version)
        except Exception as exc:
            raise UndecodableRecord(
                f"cannot decode event {_shown(topic)} of {record.key[:100]!r} version "
                f"{_shown(version)}: {type(exc).__name__}: {exc}"
            ) from exc
        if "originator_topic" in state:
            self._check_originator(state["originator_topic"], topic)
        from_version = state.pop("class_version", 1)
        while from_version < event_class.class_version:
            getattr(event_class.cls, f"upcast_v{from_version}_v{from_version + 1}")(state)
            from_version += 1
        if not event_class.required <= state.keys():
            missing = sorted(event_class.required - state.keys())
            raise UndecodableRecord(f"event {_shown(topic)} lacks its fields {missing}")
        domain_event: Any = object.__new__(event_class.cls)
        object.__setattr__(domain_event, "__dict__", state)
        return domain_event

    def _resolve(self, topic: bytes) -> _EventClass:
        """The event class ``topic`` names, if it is one of the codec's aggregates' (by its
        own topic, or a topic registered for it); never imports anything."""
        name = topic.decode("utf-8", errors="replace")
        cls = self._events.get(name)
        if cls is None:
            registered = _registered(name)
            if isinstance(registered, type) and registered in self._event_set:
                cls = registered
        if cls is None:
            owners = sorted(c.__qualname__ for c in self._owners)
            raise UndecodableRecord(
                f"unknown event type {_shown(topic)}: not an event of the aggregates {owners} "
                "(nothing was imported to resolve it)"
            )
        fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
        resolved = _EventClass(
            cls=cls,
            convert_id=find_id_convertor(cls, str),
            class_version=getattr(cls, "class_version", 1),
            required=frozenset(
                f.name
                for f in fields
                if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING
                and f.name not in _ENVELOPE
            ),
        )
        self._classes[topic] = resolved
        return resolved

    def _check_originator(self, originator_topic: object, topic: bytes) -> None:
        """A created event names its aggregate's class, which eventsourcing resolves (imports)
        when it creates the aggregate: it must be one of the codec's aggregates."""
        if isinstance(originator_topic, str):
            if originator_topic in self._owner_topics:
                return
            registered = _registered(originator_topic)
            if isinstance(registered, type) and registered in self._owners:
                return
        raise UndecodableRecord(
            f"event {_shown(topic)} names the aggregate class {str(originator_topic)[:200]!r}, "
            "which is not one of the service's aggregates (nothing was imported to resolve it)"
        )


def _shown(raw: bytes) -> str:
    """A header's value for an error message: bounded, printable."""
    return repr(raw[:200].decode("utf-8", errors="replace"))
