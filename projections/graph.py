"""A service's stores as a graph: which store forwards to which multi-input store.

:func:`bind` checks the graph a service declares (every store read exists, no cycle) and adds a
hidden :class:`Forwarder` for each multi-input store with an input of events: a store folding
the events topic whose only output is the forwarded records (re-keyed events) and whose only
state is its progress. Hidden stores have changelogs, standbys and dead-letter topics like the
others, but are neither listed at ``GET /stores`` nor queryable.

:func:`routes` says, for each store, where its task forwards: an upstream store (its changes) or
a hidden forwarder (its events) to the multi-input stores reading it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from foldstream.domain.records import EventCodec, EventRecord
from foldstream.errors import ConfigurationError
from foldstream.kafka import Partitioner
from foldstream.projections.joins import Events, Join
from foldstream.projections.projection import ErrorPolicy, Projection

#: A hidden forwarder's name is its multi-input store's with this suffix: store names cannot
#: hold a dot, so no declared store can take it.
FORWARDER_SUFFIX = ".events"


@dataclass(frozen=True)
class Forwarder(Projection):
    """Hidden: forwards the service's events to ``target``'s repartition topic, each under the
    key the target's :class:`~foldstream.projections.joins.Events` inputs give it. Its poison
    records (an event it cannot decode, a re-key function that raises) follow the target's
    ``on_error``, in its own dead-letter topic."""

    store: str
    target: str
    on_error: ErrorPolicy = "dead-letter"
    partitioner: Partitioner = "murmur2"
    _codec: EventCodec = field(default_factory=EventCodec, repr=False, compare=False)

    @property
    def codec(self) -> EventCodec:
        return self._codec

    def source_topic(self, events_topic: str) -> str:
        return events_topic

    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        raise TypeError(f"{self.store} forwards records and folds no values")


def is_hidden(projection: Projection) -> bool:
    """Whether ``projection`` is a hidden store (not listed, not queryable)."""
    return isinstance(projection, Forwarder)


def forwarder_name(store: str) -> str:
    return store + FORWARDER_SUFFIX


def bind(projections: Sequence[Projection]) -> tuple[Projection, ...]:
    """``projections`` with a hidden forwarder before each multi-input store that reads
    events; :class:`ConfigurationError` if a store reads a store that is not there, itself, or
    (through others) a store that reads it."""
    stores = {p.store: p for p in projections}
    bound: list[Projection] = []
    for projection in projections:
        if isinstance(projection, Join):
            for name in projection.upstream():
                if name not in stores:
                    raise ConfigurationError(
                        f"store {projection.store!r} reads the changes of {name!r}, which is "
                        f"not a store of the service; stores: {sorted(stores)}"
                    )
                if stores[name].kind != "point":
                    raise ConfigurationError(
                        f"store {projection.store!r} reads the changes of {name!r}, a "
                        f"{stores[name].kind} store: only point stores forward their changes"
                    )
            if any(isinstance(i, Events) for i in projection.inputs):
                bound.append(
                    Forwarder(
                        forwarder_name(projection.store),
                        projection.store,
                        projection.on_error,
                        _codec=projection.codec,
                    )
                )
        bound.append(projection)
    _check_acyclic(stores)
    return tuple(bound)


def _check_acyclic(stores: Mapping[str, Projection]) -> None:
    done: set[str] = set()

    def visit(store: str, path: tuple[str, ...]) -> None:
        if store in path:
            cycle = " -> ".join((*path[path.index(store) :], store))
            raise ConfigurationError(f"stores read each other's changes in a cycle: {cycle}")
        if store in done:
            return
        projection = stores[store]
        if isinstance(projection, Join):
            for upstream in projection.upstream():
                visit(upstream, (*path, store))
        done.add(store)

    for store in stores:
        visit(store, ())


class Route(NamedTuple):
    """Where a store forwards: to ``join``, for its ``inputs`` (indexes) that read it."""

    join: Join
    inputs: tuple[int, ...]


def routes(projections: Sequence[Projection]) -> dict[str, list[Route]]:
    """``{emitting store: [Route, ...]}``: the stores whose changes multi-input stores read,
    and the hidden forwarders of their events."""
    found: dict[str, list[Route]] = {}
    for join in projections:
        if not isinstance(join, Join):
            continue
        by_emitter: dict[str, list[int]] = {}
        for index, source in enumerate(join.inputs):
            emitter = forwarder_name(join.store) if isinstance(source, Events) else source.store
            by_emitter.setdefault(emitter, []).append(index)
        for emitter, indexes in by_emitter.items():
            found.setdefault(emitter, []).append(Route(join, tuple(indexes)))
    return found


def forwards_option(
    projections: Sequence[Projection], store: str, events_topic: str, layout: Mapping[str, int]
) -> str:
    """What a task of ``store`` needs to forward (its option ``forwards``): ``{multi-input
    store: [repartition topic, partitions]}`` as JSON, ``{}`` when it forwards nothing."""
    targets = {}
    for route in routes(projections).get(store, []):
        topic = route.join.source_topic(events_topic)
        targets[route.join.store] = [topic, layout[topic]]
    return json.dumps(targets, sort_keys=True)


def upstream_of(projection: Projection) -> list[str]:
    """The stores ``projection`` reads the changes of (none for a single-input store)."""
    return projection.upstream() if isinstance(projection, Join) else []
