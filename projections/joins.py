"""Stores beyond "fold by aggregate id": re-keyed, chained and joined stores.

A *multi-input store* folds one topic, its repartition topic ``<service>.<store>.repartition``
(``partitions`` partitions, by default as many as the events topic), keyed by the store's own
keys and partitioned with murmur2, as a Java producer would (the query router finds keys there).
What it reads is *forwarded* into that topic by the stage before (:mod:`.emit`):

- :class:`Events`: the service's domain events, each under the key ``key(event)`` returns
  (re-keying; a hidden store forwards them, see :mod:`.graph`);
- :class:`Changes`: another store's changes, as ``(key, old, new)``: either under the same key
  (``fold``: a table-table join) or grouped by ``group_by(key, value)`` with an adder and a
  subtractor (Kafka Streams' ``KTable.groupBy(...).aggregate(adder, subtractor)``): a value
  moving from one group to another is subtracted from the first and added to the second.

The store is then an ordinary single-topic store (exactly once by the source offset and the
de-duplication marks kept with its state, :mod:`.dedup`; changelog, standbys, routing). Folds of
a store with several inputs must not depend on how the inputs interleave (as in Kafka Streams,
where the order across partitions is undefined): each input's records arrive in their origin's
order, the inputs' records in any order. See ``docs/rekeying-and-joins.md``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from foldstream.domain.records import EventCodec, EventRecord
from foldstream.errors import BrokerUnavailable, ConfigurationError, UndecodableRecord
from foldstream.kafka import Partitioner
from foldstream.projections.forwarded import (
    ADD,
    CHANGE,
    EVENT,
    SUBTRACT,
    UPDATE,
    Forwarded,
    parse_forwarded,
)
from foldstream.projections.projection import (
    ErrorPolicy,
    Fold,
    Projection,
    _compact_json,
    check_declaration,
)


class Change(NamedTuple):
    """A store's value of ``key`` changing from ``old`` to ``new`` (None: no value)."""

    key: str
    old: Any
    new: Any


ChangeFold = Callable[[Any, Change], Any]
"""``(state | None, change) -> state | None``."""
GroupBy = Callable[[str, Any], "str | None"]
"""``(key, value) -> group key``, None: the value belongs to no group."""
Adder = Callable[[Any, str, Any], Any]
"""``(state | None, key, value) -> state | None``: ``value`` of ``key`` enters (adder) or
leaves (subtractor) the group whose state is ``state``."""
EventKey = Callable[[Any], "str | None"]
"""``event -> key``, None: the event is not folded."""


class InputFailed(ValueError):
    """A function of a multi-input store (a re-key function, ``group_by``, a fold, an adder or
    a subtractor) raised: the record is a poison record (see ``on_error``). The message names
    the store, the input, the function, and the topic, partition and offset it came from.

    Remedy: fix the function (it must accept every value its input can hold), then restart
    the instance; the dead-letter topic holds what it could not fold.
    """


@dataclass(frozen=True)
class Events:
    """An input of the service's domain events: ``fold(state, event)`` under the key
    ``key(event)`` returns (the aggregate id when ``key`` is None; None from ``key`` leaves the
    event out)."""

    fold: Fold
    key: EventKey | None = None

    def describe(self) -> str:
        return "the events" if self.key is None else "the events, re-keyed"

    def fold_forwarded(
        self, state: Any, forwarded: Forwarded, record: EventRecord, codec: EventCodec
    ) -> Any:
        if forwarded.kind != EVENT:
            raise UndecodableRecord(f"an input of events cannot fold a {forwarded.kind!r} record")
        event = codec.decode(EventRecord(forwarded.upstream_key, record.value, record.headers))
        return self.fold(state, event)


@dataclass(frozen=True)
class Changes:
    """An input of the changes of ``store``, another store of the service.

    Either ``fold(state, change)``, the change under its own key (a table-table join: keep
    what you need of ``change.new``); or ``group_by(key, value)`` with ``add(state, key,
    value)`` and ``subtract(state, key, value)``: the state of each group, as a value enters it
    (``add``), leaves it (``subtract``) or changes within it (``subtract`` the old, then ``add``
    the new, at once).
    """

    store: str
    fold: ChangeFold | None = None
    group_by: GroupBy | None = None
    add: Adder | None = None
    subtract: Adder | None = None

    def __post_init__(self) -> None:
        grouped = (self.group_by, self.add, self.subtract)
        if self.fold is None and None in grouped:
            raise ConfigurationError(
                f"Changes({self.store!r}) needs fold=..., or group_by=, add= and subtract="
            )
        if self.fold is not None and any(f is not None for f in grouped):
            raise ConfigurationError(
                f"Changes({self.store!r}) takes fold=... or group_by=/add=/subtract=, not both"
            )

    def describe(self) -> str:
        how = "grouped" if self.group_by is not None else "by key"
        return f"the changes of {self.store!r}, {how}"

    def fold_forwarded(
        self, state: Any, forwarded: Forwarded, record: EventRecord, codec: EventCodec
    ) -> Any:
        kind = forwarded.kind
        old, new = _change_pair(record.value)
        key = _text(forwarded.upstream_key)
        if self.fold is not None:
            if kind != CHANGE:
                raise UndecodableRecord(f"an input of changes by key cannot fold a {kind!r}")
            return self.fold(state, Change(key, old, new))
        assert self.add is not None and self.subtract is not None
        if kind == ADD:
            return self.add(state, key, new)
        if kind == SUBTRACT:
            return self.subtract(state, key, old)
        if kind == UPDATE:
            return self.add(self.subtract(state, key, old), key, new)
        raise UndecodableRecord(f"an input of grouped changes cannot fold a {kind!r} record")


Input = Events | Changes


def _change_pair(value: bytes | None) -> tuple[Any, Any]:
    try:
        pair = json.loads(value or b"")
    except ValueError:
        pair = None
    if not isinstance(pair, list) or len(pair) != 2:
        raise UndecodableRecord("a forwarded change's value must be the JSON [old, new]")
    return pair[0], pair[1]


def _text(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        raise UndecodableRecord(f"key {key[:100]!r} is not UTF-8") from None


def repartition_topic(events_topic: str, store: str) -> str:
    """``<service>.<store>.repartition`` of the service whose events topic is
    ``events_topic`` (``<service>.events``)."""
    return f"{events_topic.removesuffix('.events')}.{store}.repartition"


@dataclass(frozen=True)
class Join(Projection):
    """A store folded from ``inputs`` (:class:`Events` and :class:`Changes`), each record under
    the key its input gives it: a re-keyed store (one input of events with a ``key``), a
    stream-table or table-table join (several inputs keyed alike: the store keeps what it needs
    of each side in its own state), an aggregate of another store's values (see
    :class:`Aggregation`).

    Its source is its repartition topic, ``partitions`` partitions (None: as many as the events
    topic). The order of records from *different* inputs (or from different partitions of one
    input's source) is undefined: folds must give the same result in any such order.
    """

    store: str
    inputs: Sequence[Input]
    partitions: int | None = None
    on_error: ErrorPolicy = "dead-letter"
    partitioner: Partitioner = field(default="murmur2", init=False)
    _codec: EventCodec = field(default_factory=EventCodec, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_declaration(self)
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not self.inputs or not all(isinstance(i, Events | Changes) for i in self.inputs):
            raise ConfigurationError(
                f"store {self.store!r}: inputs must be one or more Events(...) and Changes(...)"
            )
        if self.partitions is not None and self.partitions < 1:
            raise ConfigurationError(f"store {self.store!r}: partitions must be >= 1")

    def for_events(self, codec: EventCodec) -> Join:
        bound = copy.copy(self)  # not dataclasses.replace: subclasses have their own __init__
        object.__setattr__(bound, "_codec", codec)
        return bound

    @property
    def codec(self) -> EventCodec:
        return self._codec

    def source_topic(self, events_topic: str) -> str:
        return repartition_topic(events_topic, self.store)

    def upstream(self) -> list[str]:
        """The stores whose changes this store reads."""
        return [i.store for i in self.inputs if isinstance(i, Changes)]

    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        return self.apply_forwarded(current, record, parse_forwarded(record))

    def apply_forwarded(
        self, current: bytes | None, record: EventRecord, forwarded: Forwarded
    ) -> bytes | None:
        """:meth:`apply` of ``record``, whose headers say ``forwarded`` (parsed once by the
        task, :class:`~foldstream.projections.staged.Stage`, for its marks and its fold)."""
        if forwarded.input >= len(self.inputs):
            raise UndecodableRecord(
                f"store {self.store!r} has {len(self.inputs)} inputs, no input {forwarded.input}"
            )
        source = self.inputs[forwarded.input]
        # Text, not bytes: json.loads would detect the encoding of every value.
        state = None if current is None else json.loads(current.decode())
        try:
            new_state = source.fold_forwarded(state, forwarded, record, self._codec)
        except (BrokerUnavailable, UndecodableRecord):
            raise
        except Exception as exc:
            raise InputFailed(
                f"store {self.store!r}, input {forwarded.input} ({source.describe()}): its "
                f"function raised for key {forwarded.upstream_key[:100]!r} forwarded from "
                f"{forwarded.origin.topic} partition {forwarded.origin.partition} offset "
                f"{forwarded.position[0]} (by {forwarded.origin.emitter!r}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if new_state is None:
            return None
        return _compact_json(new_state).encode()


class Aggregation(Join):
    """The state of each group of ``source``'s values (Kafka Streams' ``KTable.groupBy`` with
    an adder and a subtractor): ``Join(store, [Changes(source, group_by=..., add=...,
    subtract=...)])``. ``group_by(key, value)`` names a value's group; ``add(state, key,
    value)`` and ``subtract(state, key, value)`` update the group's state as a value enters or
    leaves it (a value that changes within its group is subtracted, then added, in one step).
    """

    def __init__(
        self,
        store: str,
        *,
        source: str,
        group_by: GroupBy,
        add: Adder,
        subtract: Adder,
        partitions: int | None = None,
        on_error: ErrorPolicy = "dead-letter",
    ) -> None:
        inputs = (Changes(source, group_by=group_by, add=add, subtract=subtract),)
        super().__init__(store, inputs, partitions, on_error)
