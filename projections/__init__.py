"""Projections: folds of a topic into a named, queryable store (one RocksDB per partition).

``EventProjection(store, fold)`` folds the service's domain events; ``LatestValue(store, topic)``
keeps the latest value of every key of any topic (KTable semantics, tombstones delete);
``OrderedProjection(store, entry=...)`` keeps entries under each key sorted by a sort key (range
queries); ``WindowedAggregate(store, fold=..., size=...)`` folds each key per time window.
"""

from __future__ import annotations

from foldstream.projections.ordered import OrderedProjection, field_entry
from foldstream.projections.projection import EventProjection, LatestValue, Projection
from foldstream.projections.windows import WindowedAggregate

__all__ = [
    "EventProjection",
    "LatestValue",
    "OrderedProjection",
    "Projection",
    "WindowedAggregate",
    "field_entry",
]
