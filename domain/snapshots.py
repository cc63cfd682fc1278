"""Snapshots of aggregates: an aggregate's whole state at one version, as bytes, and back.

The command side keeps each partition's aggregates as snapshots in a store
(:mod:`foldstream.commands.aggregates`), so that it holds only a bounded cache of them in
memory and a takeover replays only the events after the snapshots. A snapshot is what
eventsourcing's ``Snapshot.take`` keeps (the aggregate's ``__dict__`` without its id, version
and pending events, with ``class_version`` when it is above 1), encoded as JSON by the same
transcoder as the events (datetimes, UUIDs and decimals survive), under the name the service
gives the aggregate class::

    {"aggregate": "product", "version": 3, "state": {"on_hand": 5, "_created_on": ...}}

Decoding upcasts the state as eventsourcing does: the aggregate class's ``upcast_vX_vY``
static methods, from the snapshot's ``class_version`` to the class's. It resolves the
aggregate only among the service's own aggregate classes: a snapshot read from a changelog
(untrusted, like every record) can never make a reader import anything.

A state the transcoder cannot encode (a set, an object of a class of the service's own) has
no snapshot: :class:`UnstorableAggregate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventsourcing.persistence import JSONTranscoder

from foldstream.domain.aggregate import Aggregate
from foldstream.domain.records import json_transcoder
from foldstream.errors import FoldstreamError

#: What eventsourcing's aggregates keep beside their state: restored from the snapshot's
#: envelope (id, version) or made empty (pending events).
_ENVELOPE = ("_id", "_version", "_pending_events")


class UnstorableAggregate(FoldstreamError):
    """An aggregate's state cannot be kept as a snapshot: the JSON transcoder of the events
    cannot encode one of its attributes (a set, an instance of a class of the service's own).
    The command was refused and nothing was appended.

    Remedy: keep aggregate state in what events may carry (numbers, strings, booleans, None,
    lists and dicts of them, datetimes, UUIDs, decimals), or register a transcoding for the
    type with the codec (eventsourcing's ``Transcoding``).
    """


class UndecodableSnapshot(FoldstreamError, ValueError):
    """A stored snapshot is not one of the service's aggregates: not the transcoder's JSON, no
    ``aggregate``/``version``/``state``, an aggregate name the service does not define, or a
    state its upcasters cannot bring to the class's version.

    Remedy: the aggregate takes no commands until its snapshot is replaced. If the aggregate
    class was renamed in the service, name it as before; otherwise see
    ``docs/concepts/aggregate-store.md`` for rebuilding the snapshots from the events topic.
    """


class SnapshotCodec:
    """Encodes aggregates of ``aggregates`` (``{"product": Product}``, the service's) as
    snapshot bytes, and decodes them back (upcast to each class's current version)."""

    def __init__(
        self, aggregates: Mapping[str, type[Aggregate]], transcoder: JSONTranscoder | None = None
    ) -> None:
        self._classes = dict(aggregates)
        self._names = {cls: name for name, cls in self._classes.items()}
        self._transcoder = transcoder or json_transcoder()

    def encode(self, aggregate: Aggregate) -> bytes:
        """The snapshot of ``aggregate``; :class:`UnstorableAggregate` if its state cannot be
        encoded, or its class is none of the codec's aggregates."""
        cls = type(aggregate)
        name = self._names.get(cls)
        if name is None:
            raise UnstorableAggregate(
                f"{cls.__qualname__} is not one of the service's aggregates {sorted(self._classes)}"
            )
        state = {k: v for k, v in vars(aggregate).items() if k not in _ENVELOPE}
        class_version = getattr(cls, "class_version", 1)
        if class_version > 1:
            state["class_version"] = class_version
        snapshot = {"aggregate": name, "version": aggregate.version, "state": state}
        try:
            return self._transcoder.encode(snapshot)
        except Exception as exc:
            raise UnstorableAggregate(
                f"the state of {name} {aggregate.id!r} cannot be kept as a snapshot: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def decode(self, aggregate_id: str, snapshot: bytes) -> Aggregate:
        """The aggregate ``aggregate_id`` as ``snapshot`` holds it, upcast to its class's
        current version; :class:`UndecodableSnapshot` for anything else."""
        try:
            found: Any = self._transcoder.decode(snapshot)
        except Exception as exc:
            raise UndecodableSnapshot(f"not a snapshot: {type(exc).__name__}: {exc}") from exc
        if not isinstance(found, dict):
            raise UndecodableSnapshot(f"not a snapshot: JSON {type(found).__name__}")
        name, version, state = (found.get(k) for k in ("aggregate", "version", "state"))
        cls = self._classes.get(name) if isinstance(name, str) else None
        if cls is None:
            raise UndecodableSnapshot(
                f"the snapshot names the aggregate {str(name)[:100]!r}, not one of "
                f"{sorted(self._classes)} (nothing was imported to resolve it)"
            )
        if type(version) is not int or version < 1 or not isinstance(state, dict):
            raise UndecodableSnapshot("a snapshot needs a version (an integer >= 1) and a state")
        from_version = state.pop("class_version", 1)
        to_version = getattr(cls, "class_version", 1)
        if type(from_version) is not int or not 1 <= from_version <= to_version:
            raise UndecodableSnapshot(
                f"the snapshot's class_version {from_version!r} is not one {cls.__qualname__} "
                f"(version {to_version}) can upcast"
            )
        try:
            while from_version < to_version:
                getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(state)
                from_version += 1
        except Exception as exc:
            raise UndecodableSnapshot(
                f"upcasting a snapshot of {cls.__qualname__} failed: {type(exc).__name__}: {exc}"
            ) from exc
        state.update(_id=aggregate_id, _version=version, _pending_events=[])
        aggregate: Aggregate = object.__new__(cls)
        object.__setattr__(aggregate, "__dict__", state)
        return aggregate
