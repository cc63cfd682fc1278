"""Projections: folds of a topic into a named, queryable store (one RocksDB per partition).

``EventProjection(store, fold)`` folds the service's domain events; ``LatestValue(store, topic)``
keeps the latest value of every key of any topic (KTable semantics, tombstones delete).
"""

from __future__ import annotations

from foldstream.projections.projection import EventProjection, LatestValue, Projection

__all__ = ["EventProjection", "LatestValue", "Projection"]
