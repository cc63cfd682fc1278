"""An instance's physical stores beyond the service's declared ones: the rebuild generations
(:mod:`foldstream.cluster.rebuilds`), found in the state directory at start and added while it
runs, with their layouts and topics."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from foldstream.changelog import StoreLayout
from foldstream.cluster.rebuilds import rebuilt_stores
from foldstream.errors import StoreNotFound
from foldstream.projections import Projection
from foldstream.projections.query_groups import SEPARATOR
from foldstream.projections.versions import rebuild_refusal, version_name
from foldstream.service import Service
from foldstream.settings import Settings
from foldstream.topics import ensure_service_topics, store_topics

if TYPE_CHECKING:
    from foldstream.projections.runner import ProjectionRunner


class QueryStores(Mapping[str, tuple[str, ...]]):
    """``{query name: its stores}`` of the stores of ``catalog`` (the projections' query names,
    :func:`~foldstream.projections.runner.query_name`: a store's, or the stores of a shared
    query joined by ``+``), as the catalog is now: a store the catalog does not know is left
    out. Iterating gives each store's own name."""

    def __init__(self, catalog: Mapping[str, object], service: str) -> None:
        self.catalog = catalog
        self.prefix = f"{service}."

    def __getitem__(self, query: str) -> tuple[str, ...]:
        key = query.removeprefix(self.prefix)
        stores = tuple(store for store in key.split(SEPARATOR) if store in self.catalog)
        if key == query or not stores:
            raise KeyError(query)
        return stores

    def __iter__(self) -> Iterator[str]:
        return (self.prefix + store for store in list(self.catalog))

    def __len__(self) -> int:
        return len(self.catalog)


def every_projection(service: Service, settings: Settings) -> list[Projection]:
    """The service's projections and those of the rebuild generations its state directory
    lists (of versions the service still declares)."""
    declared = {p.store for p in service.projections}
    rebuilt = sorted(s for s in rebuilt_stores(settings.state_dir) if version_name(s) in declared)
    return [*service.projections, *(service.projection(store) for store in rebuilt)]


def store_layout(settings: Settings, projection: Projection) -> StoreLayout:
    """Where the state of ``projection``'s store comes from."""
    return StoreLayout(
        projection.source_topic(settings.events_topic),
        settings.changelog_topic(projection.store),
        settings.on_stale_state,
        projection.table_format,
    )


class ServiceGenerations:
    """What a cluster member needs of the service to add a rebuild generation
    (:class:`foldstream.cluster.rebuilds.Generations`): whether a store may be rebuilt, its
    topics and its query (started by ``runner``); ``partitions`` of each source topic."""

    def __init__(
        self,
        service: Service,
        settings: Settings,
        runner: ProjectionRunner,
        partitions: dict[str, int],
    ) -> None:
        self.service = service
        self.settings = settings
        self.runner = runner
        self.partitions = partitions

    def refusal(self, store: str) -> str | None:
        return rebuild_refusal(self.service.projections, store)

    def prepare(self, store: str) -> StoreLayout:
        projection = self.service.projection(store)
        topic = projection.source_topic(self.settings.events_topic)
        if topic not in self.partitions:
            raise StoreNotFound(f"store {store!r} reads {topic!r}, which is not read here")
        ensure_service_topics(
            self.settings, store_topics(self.settings, store, self.partitions[topic])
        )
        self.runner.add(projection)
        return store_layout(self.settings, projection)
