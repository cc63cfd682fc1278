"""Stage 1 of a multi-input store: a store's changes (or, from a hidden forwarder, the
service's events) forwarded to the repartition topics of the multi-input stores that read them.

For each record a task folds, :meth:`Emitter.changes` (or :meth:`Emitter.events`) computes what
to forward: the user's functions run there, so an error of theirs is the record's (a poison
record of the emitting store: its value and its forwards stay as they were, and the two stores
stay consistent). :meth:`Emitter.send` then queues the records on the task's producer with the
chunk's changelog records: the chunk commits once all are acknowledged. Each record names its
origin, its position and the position of the emitter's previous record to the same repartition
partition, kept in a *cursor* in the emitting store's partition (:mod:`.dedup` says why).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable, UndecodableRecord
from foldstream.kafka import partition_for, produce_when_room
from foldstream.projections.forwarded import (
    ADD,
    CHANGE,
    EVENT,
    FORWARD_HEADER,
    FORWARD_KEY_HEADER,
    RESERVED,
    SUBTRACT,
    UPDATE,
    Origin,
    Position,
    change_value,
    forward_header,
    header_prefix,
    parse_position,
    position_bytes,
)
from foldstream.projections.graph import routes
from foldstream.projections.joins import Changes, Events, InputFailed, Join
from foldstream.projections.poison import NO_KEY, ValueTooLarge
from foldstream.projections.projection import Projection
from foldstream.projections.task_output import MAX_VALUE_BYTES


@dataclass(frozen=True)
class Target:
    """A multi-input store a task forwards to: its ``inputs`` that read the emitter, and its
    repartition ``topic`` of ``partitions`` partitions."""

    join: Join
    inputs: tuple[int, ...]
    topic: str
    partitions: int


def targets_of(projections: Sequence[Projection], store: str, option: str) -> list[Target]:
    """The targets of ``store``'s task, from its option ``forwards`` (topics and partition
    counts, :func:`~foldstream.projections.graph.forwards_option`)."""
    wanted: Mapping[str, list[Any]] = json.loads(option or "{}")
    return [
        Target(route.join, route.inputs, str(topic), int(partitions))
        for route in routes(projections).get(store, [])
        if route.join.store in wanted
        for topic, partitions in [wanted[route.join.store]]
    ]


def cursor_key(store: str) -> bytes:
    """The reserved key of the cursors of the records forwarded to ``store``."""
    return RESERVED + b"cursor\x00" + store.encode()


class Pending(NamedTuple):
    """A record to forward once its source record is folded."""

    target: Target
    input: int
    kind: str
    key: bytes  # the key downstream
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]  # an event's own


_RESERVED_TEXT = RESERVED.decode()
Described = Callable[[], str]
"""What a user's function is called for, described only when it fails (a record's error)."""


def _new_key(key: Any, what: Described) -> bytes | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or key.startswith(_RESERVED_TEXT):
        raise InputFailed(
            f"{what()} returned {key!r}: a key must be a non-empty string not starting with "
            "NUL, or None"
        )
    return key.encode()


class Emitter:
    """What one partition of an emitting store (``name``, folding ``topic``) forwards, chunk
    by chunk: :meth:`load` its cursors, then per record :meth:`changes` or :meth:`events` and
    :meth:`send`, then write :meth:`written` with the chunk."""

    def __init__(self, name: str, topic: str, partition: int, targets: Sequence[Target]) -> None:
        self.origin = Origin(name, topic, partition)
        self.targets = list(targets)
        self._cursors: dict[str, dict[int, Position]] = {}
        self._moved: set[str] = set()
        self._prefixes: dict[tuple[int, str], bytes] = {}
        # A hidden forwarder's inputs (each an input of events of a target).
        self._event_inputs = [
            (target, index, source)
            for target in self.targets
            for index in target.inputs
            if isinstance(source := target.join.inputs[index], Events)
        ]

    def keys(self) -> list[bytes]:
        """The reserved keys a chunk reads (the cursors)."""
        return [cursor_key(t.join.store) for t in self.targets]

    def load(self, get: Callable[[bytes], bytes | None]) -> None:
        for target in self.targets:
            raw = get(cursor_key(target.join.store))
            found = {} if raw is None else json.loads(raw)
            self._cursors[target.join.store] = {int(r): parse_position(p) for r, p in found.items()}
        self._moved.clear()

    def where(self, offset: int) -> str:
        return f"{self.origin.topic} partition {self.origin.partition} offset {offset}"

    def changes(
        self, key: bytes, old: bytes | None, new: bytes | None, offset: int
    ) -> list[Pending]:
        """The records forwarding ``key``'s value changing from ``old`` to ``new``."""
        if old == new or not self.targets:
            return []
        try:
            key.decode("utf-8")  # stage 2 hands its functions the key as text
        except UnicodeDecodeError:
            raise UndecodableRecord(
                f"key {key[:100]!r} is not UTF-8: it cannot be forwarded"
            ) from None
        pending = []
        for target in self.targets:
            for index in target.inputs:
                source = target.join.inputs[index]
                assert isinstance(source, Changes)
                if source.group_by is None:
                    pending.append(Pending(target, index, CHANGE, key, change_value(old, new), ()))
                else:
                    pending += self._regrouped(target, index, source, key, old, new, offset)
        for item in pending:
            if len(item.key) + len(item.value or b"") + len(key) > MAX_VALUE_BYTES:
                raise ValueTooLarge(
                    f"forwarding the change of {key[:100]!r} to {item.target.join.store!r} "
                    f"would take more than {MAX_VALUE_BYTES} bytes"
                )
        return pending

    def _regrouped(
        self,
        target: Target,
        index: int,
        source: Changes,
        key: bytes,
        old: bytes | None,
        new: bytes | None,
        offset: int,
    ) -> list[Pending]:
        text = key.decode()

        def what() -> str:
            return (
                f"store {target.join.store!r}, input {index} ({source.describe()}): group_by "
                f"for key {text[:100]!r} at {self.where(offset)}"
            )

        groups = [
            None
            if value is None
            else _new_key(_call(source.group_by, what, text, json.loads(value)), what)
            for value in (old, new)
        ]
        if groups[0] is not None and groups[0] == groups[1]:
            value = change_value(old, new)
            if len(value) + 2 * len(key) <= MAX_VALUE_BYTES:
                return [Pending(target, index, UPDATE, groups[0], value, ())]
            # Too large as one record: subtracted, then added, in two.
        pending = []
        if groups[0] is not None:
            pending.append(Pending(target, index, SUBTRACT, groups[0], change_value(old, None), ()))
        if groups[1] is not None:
            pending.append(Pending(target, index, ADD, groups[1], change_value(None, new), ()))
        return pending

    def events(self, record: EventRecord, offset: int) -> list[Pending]:
        """The records forwarding the event of ``record`` (a hidden forwarder's)."""
        if record.key is None:
            raise UndecodableRecord(NO_KEY)
        event = None
        pending = []
        for target, index, source in self._event_inputs:
            if source.key is None:
                key: bytes | None = record.key
            else:
                if event is None:
                    event = target.join.codec.decode(record)

                def what(
                    target: Target = target, index: int = index, source: Events = source
                ) -> str:
                    return (
                        f"store {target.join.store!r}, input {index} ({source.describe()}): its "
                        f"key function for the event at {self.where(offset)}"
                    )

                key = _new_key(_call(source.key, what, event), what)
            if key is not None:
                pending.append(Pending(target, index, EVENT, key, record.value, record.headers))
        return pending

    def send(
        self,
        producer: Any,
        offset: int,
        upstream_key: bytes,
        pending: Sequence[Pending],
        on_delivery: Callable[[Any, Any], None],
    ) -> None:
        """Queue ``pending`` (the records of the source record at ``offset``) on ``producer``,
        in order, each after the emitter's previous record to its repartition partition."""
        for seq, item in enumerate(pending):
            target = item.target
            partition = partition_for(item.key, target.partitions)
            cursors = self._cursors[target.join.store]
            prefix = self._prefixes.get((item.input, item.kind))
            if prefix is None:
                prefix = header_prefix(item.input, item.kind, self.origin)
                self._prefixes[item.input, item.kind] = prefix
            header = forward_header(prefix, (offset, seq), cursors.get(partition))
            produce_when_room(
                producer,
                target.topic,
                wait_s=0.01,
                key=item.key,
                value=item.value,
                partition=partition,
                headers=[
                    *item.headers,
                    (FORWARD_HEADER, header),
                    (FORWARD_KEY_HEADER, upstream_key),
                ],
                on_delivery=on_delivery,
            )
            cursors[partition] = (offset, seq)
            self._moved.add(target.join.store)

    def written(self) -> dict[bytes, bytes]:
        """The cursors that moved, as the reserved keys and values to write."""
        return {
            cursor_key(store): json.dumps(
                {str(r): position_bytes(p).decode() for r, p in sorted(cursors.items())},
                separators=(",", ":"),
            ).encode()
            for store, cursors in self._cursors.items()
            if store in self._moved
        }


def _call(function: Callable[..., Any] | None, what: Described, *arguments: Any) -> Any:
    """``function(*arguments)``; its error is the record's, named by ``what``."""
    assert function is not None
    try:
        return function(*arguments)
    except BrokerUnavailable:
        raise
    except Exception as exc:
        raise InputFailed(f"{what()} raised {type(exc).__name__}: {exc}") from exc
