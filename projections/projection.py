"""Projection definitions: what a store holds and how one record changes it.

Stored values are JSON, so the query API can answer with the stored bytes as they are.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from foldstream.domain.records import EventCodec, EventRecord
from foldstream.errors import ConfigurationError
from foldstream.kafka import PARTITIONERS, Partitioner
from foldstream.state.format import TABLE_FORMAT

_compact_json = json.JSONEncoder(separators=(",", ":")).encode

Fold = Callable[[Any, Any], Any]
"""``(state | None, event) -> state | None``; returning None deletes the key."""

StoreKind = Literal["point", "ordered", "windowed"]


class Projection(ABC):
    """A store kept up to date from one topic, partition by partition.

    :attr:`kind` says what the store answers: ``point`` lookups by key (this class), or ranges
    of an ``ordered`` store's entries and the windows of a ``windowed`` one
    (:mod:`~foldstream.projections.ordered`, :mod:`~foldstream.projections.windows`).
    """

    store: str
    partitioner: Partitioner
    kind: ClassVar[StoreKind] = "point"

    @property
    def table_format(self) -> str:
        """The on-disk format of the store's partitions (:mod:`foldstream.state.format`)."""
        return TABLE_FORMAT

    def read_keys(self, records: Sequence[tuple[int, EventRecord]]) -> list[bytes]:
        """The stored keys a chunk of ``(offset, record)`` folds from, read in one round trip
        before it is folded (others are read one by one)."""
        return list(dict.fromkeys(record.key for _, record in records))

    @abstractmethod
    def source_topic(self, events_topic: str) -> str:
        """The topic folded into the store (given the service's events topic)."""

    @abstractmethod
    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        """The stored value after ``record``: new JSON bytes, or None to delete the key."""


def _check_store_name(store: str) -> None:
    if not store or not all(c.isalnum() or c in "-_" for c in store):
        raise ConfigurationError(f"store name {store!r} must be letters, digits, '-' or '_'")


@dataclass(frozen=True)
class EventProjection(Projection):
    """Folds the service's domain events into ``store``, keyed by aggregate id.

    ``fold(state, event)`` gets the key's current state (None at first) and a domain event,
    and returns the new JSON-serialisable state, or None to delete the key.
    """

    store: str
    fold: Fold
    partitioner: Partitioner = "murmur2"
    _codec: EventCodec = field(default_factory=EventCodec, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_store_name(self.store)

    def source_topic(self, events_topic: str) -> str:
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
    clients, kafka-python) or ``"consistent"`` (librdkafka's default, CRC32).
    """

    store: str
    topic: str
    value_format: Literal["json", "string"] = "json"
    partitioner: Partitioner = "murmur2"

    def __post_init__(self) -> None:
        _check_store_name(self.store)
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
