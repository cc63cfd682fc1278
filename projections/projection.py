"""Projection definitions: what a store holds and how one record changes it.

Stored values are JSON, so the query API can answer with the stored bytes as they are.

``on_error`` says what a projection does with a record it cannot fold (a poison record: the
fold, the decoding or the encoding raised, a few times): ``"dead-letter"`` (the default) sends
it to the store's dead-letter topic ``<service>.<store>.dlq`` and moves on, ``"skip"`` counts,
logs and moves on, ``"stop"`` stops folding that partition (``GET /ready`` names it) until the
instance restarts. See ``docs/operations/poison-records.md``.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from foldstream.domain.records import EventCodec, EventRecord
from foldstream.errors import ConfigurationError
from foldstream.kafka import PARTITIONERS, Partitioner
from foldstream.state.format import TABLE_FORMAT

_compact_json = json.JSONEncoder(separators=(",", ":")).encode

Fold = Callable[[Any, Any], Any]
"""``(state | None, event) -> state | None``; returning None deletes the key."""

ErrorPolicy = Literal["dead-letter", "skip", "stop"]
ERROR_POLICIES: tuple[str, ...] = get_args(ErrorPolicy)
StoreKind = Literal["point", "ordered", "windowed"]


class Projection(ABC):
    """A store kept up to date from one topic, partition by partition.

    :attr:`kind` says what the store answers: ``point`` lookups by key (this class), or ranges
    of an ``ordered`` store's entries and the windows of a ``windowed`` one
    (:mod:`~foldstream.projections.ordered`, :mod:`~foldstream.projections.windows`).
    """

    store: str
    partitioner: Partitioner
    on_error: ErrorPolicy = "dead-letter"
    #: The version of the store's fold (:mod:`~foldstream.projections.versions`).
    version: int = 1

    def for_events(self, codec: EventCodec) -> Projection:
        """This projection decoding the service's domain events with ``codec`` (the
        :class:`~foldstream.service.Service` calls it with its own); itself when it decodes
        no events."""
        return self

    kind: ClassVar[StoreKind] = "point"

    @property
    def table_format(self) -> str:
        """The on-disk format of the store's partitions (:mod:`foldstream.state.format`)."""
        return TABLE_FORMAT

    def read_keys(self, records: Sequence[tuple[int, EventRecord]]) -> list[bytes]:
        """The stored keys a chunk of ``(offset, record)`` folds from, read in one round trip
        before it is folded (others are read one by one)."""
        return list(dict.fromkeys(r.key for _, r in records if r.key is not None))

    @abstractmethod
    def source_topic(self, events_topic: str) -> str:
        """The topic folded into the store (given the service's events topic)."""

    @abstractmethod
    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        """The stored value after ``record``: new JSON bytes, or None to delete the key."""


def check_declaration(projection: Projection) -> None:
    from foldstream.projections.versions import check_version

    store = projection.store
    name = check_version(projection)
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ConfigurationError(f"store name {name!r} must be letters, digits, '-' or '_'")
    if projection.on_error not in ERROR_POLICIES:
        raise ConfigurationError(
            f"store {store!r}: on_error must be one of {ERROR_POLICIES}, "
            f"not {projection.on_error!r}"
        )


@dataclass(frozen=True)
class EventProjection(Projection):
    """Folds the service's domain events into ``store``, keyed by aggregate id.

    ``fold(state, event)`` gets the key's current state (None at first) and a domain event,
    and returns the new JSON-serialisable state, or None to delete the key. Events are decoded
    with the codec of the service the projection belongs to, which accepts the service's own
    aggregates' events only (a projection outside a service decodes none).

    With ``key``, each event is folded under the key ``key(event)`` returns instead (None:
    the event is left out): a re-keyed store, which a :class:`~foldstream.service.Service`
    makes a :class:`~foldstream.projections.joins.Join` of one input of events (its records
    travel through a repartition topic: ``docs/rekeying-and-joins.md``).
    """

    store: str
    fold: Fold
    partitioner: Partitioner = "murmur2"
    on_error: ErrorPolicy = "dead-letter"
    key: Callable[[Any], str | None] | None = None
    version: int = 1
    _codec: EventCodec = field(default_factory=EventCodec, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_declaration(self)
        if self.key is not None and self.partitioner != "murmur2":
            raise ConfigurationError(
                f"store {self.store!r}: a re-keyed store is partitioned with murmur2"
            )
        if self.key is not None and self.version != 1:
            raise ConfigurationError(
                f"store {self.store!r}: a re-keyed store has no versions yet; give the new "
                "fold a new store name instead"
            )

    def for_events(self, codec: EventCodec) -> Projection:
        if self.key is not None:
            from foldstream.projections.joins import Events, Join

            rekeyed = Join(self.store, [Events(self.fold, key=self.key)], on_error=self.on_error)
            return rekeyed.for_events(codec)
        return dataclasses.replace(self, _codec=codec)

    def source_topic(self, events_topic: str) -> str:
        if self.key is not None:
            raise ConfigurationError(
                f"store {self.store!r} is re-keyed: it is folded as part of a Service only"
            )
        return events_topic

    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        state = None if current is None else json.loads(current)
        new_state = self.fold(state, self._codec.decode(record))
        if new_state is None:
            return None
        return _compact_json(new_state).encode()


@dataclass(frozen=True)
class LatestValue(Projection):
    """The latest value of every key of ``topic``, written by any producer (a queryable topic).

    ``value_format`` is ``"json"`` (values must parse as JSON) or ``"string"`` (UTF-8 text,
    served as a JSON string). A record without a value (tombstone) deletes its key.
    ``partitioner`` declares how the topic's producer chose partitions: ``"murmur2"`` (Java
    clients, kafka-python) or ``"consistent"`` (librdkafka's default, CRC32). A record
    without a key, or whose JSON Python cannot parse (nested too deeply), is a poison record
    (``on_error``).
    """

    store: str
    topic: str
    value_format: Literal["json", "string"] = "json"
    partitioner: Partitioner = "murmur2"
    on_error: ErrorPolicy = "dead-letter"
    version: int = 1

    def __post_init__(self) -> None:
        check_declaration(self)
        if self.value_format not in ("json", "string"):
            raise ConfigurationError(
                f"value_format must be 'json' or 'string', not {self.value_format!r}"
            )
        if self.partitioner not in PARTITIONERS:
            raise ConfigurationError(
                f"partitioner must be one of {PARTITIONERS}, not {self.partitioner!r}"
            )

    def source_topic(self, events_topic: str) -> str:
        return self.topic

    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        if record.value is None:
            return None
        if self.value_format == "string":
            return json.dumps(record.value.decode("utf-8", errors="replace")).encode()
        try:
            json.loads(record.value)
        except ValueError:
            # A value that is not JSON is kept as text rather than stopping the projection.
            return json.dumps(record.value.decode("utf-8", errors="replace")).encode()
        return record.value
