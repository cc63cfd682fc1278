"""Which stores fold in one streaming query.

Every Spark micro-batch has a fixed cost (planning, the tail of the topic, scheduling a task and
its Python worker, the commit): a query per store paid it once per store, for the same records
of the same topic. The stores of one source topic that fold each record on their own (no
forwarding to other stores) share a query instead, as a Kafka Streams sub-topology feeds every
store of its input: one micro-batch reads the records once and each store folds them, with its
own offset, changelog and poison records (docs/decisions.md, "One query per topic").

A store keeps a query of its own when it forwards its changes or records to other stores or
reads them (re-keying, chained stores and joins: their exactly-once bookkeeping is per store),
or while another version of it runs beside it: a new version or a rebuild generation builds
from offset 0, and the version answering must not wait for that (nor, on a member started with
an empty state directory, for an old version rebuilt from offset 0 until it is retired). Once
one version is left, it joins the shared query at the instance's next start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from foldstream.projections.graph import Forwarder, routes
from foldstream.projections.joins import Join
from foldstream.projections.projection import Projection
from foldstream.projections.versions import logical_name
from foldstream.state.host import StoreHost

log = logging.getLogger(__name__)

#: Joins the stores' names in a shared query's name (store names never hold it).
SEPARATOR = "+"


@dataclass(frozen=True)
class QueryGroup:
    """The projections one streaming query folds: all of ``topic``."""

    topic: str
    projections: tuple[Projection, ...]

    @property
    def stores(self) -> tuple[str, ...]:
        return tuple(p.store for p in self.projections)

    @property
    def key(self) -> str:
        """The group's name: its stores' names, joined by :data:`SEPARATOR`."""
        return SEPARATOR.join(self.stores)


def shares_a_query(
    projection: Projection, projections: Sequence[Projection], emitters: Collection[str]
) -> bool:
    """Whether ``projection`` may fold in a query with other stores of its topic
    (``emitters``: the stores whose changes or records others read, :func:`routes`)."""
    if isinstance(projection, Join | Forwarder) or projection.store in emitters:
        return False
    name = logical_name(projection.store)
    return all(p is projection or logical_name(p.store) != name for p in projections)


def query_groups(projections: Sequence[Projection], events_topic: str) -> list[QueryGroup]:
    """The queries that fold ``projections`` (in their order), as the module says."""
    grouped: dict[tuple[str, ...], list[Projection]] = {}
    emitters = routes(projections).keys()
    for projection in projections:
        topic = projection.source_topic(events_topic)
        shared = shares_a_query(projection, projections, emitters)
        key = (topic,) if shared else (topic, projection.store)
        grouped.setdefault(key, []).append(projection)
    return [QueryGroup(key[0], tuple(members)) for key, members in grouped.items()]


def start_offsets(
    host: StoreHost, topic: str, stopped: Mapping[str, set[int]], partitions: Iterable[int]
) -> dict[int, int]:
    """``{partition: offset}`` to read ``partitions`` of ``topic`` from, for the stores of a
    query (``{store: its stopped partitions}``): the lowest next offset of the stores that hold
    the partition and fold it (each store skips what it applied already). A partition no store
    holds (released meanwhile) is left out."""
    starts: dict[int, int] = {}
    wanted = sorted(partitions)
    for store, stopped_here in stopped.items():
        for partition in wanted:
            offset = host.next_offset(store, partition)
            if offset is None:
                log.info("store %s: partition %d of %s is not held here", store, partition, topic)
            elif partition not in stopped_here:
                starts[partition] = min(offset, starts.get(partition, offset))
    return starts


def stores_option(entries: Sequence[dict[str, str]]) -> str:
    """The ``stores`` option of a shared query's source: each store's own options."""
    return json.dumps(list(entries))


def store_entries(options: Mapping[str, str]) -> list[dict[str, str]]:
    """Each store's options of a task, from its option ``stores`` (:func:`stores_option`: a
    list of ``{"store", "changelog_topic", "dead_letter_topic", "forwards"}``, the topics and
    forwards optional)."""
    entries: list[dict[str, str]] = json.loads(options["stores"])
    return entries
