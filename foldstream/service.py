"""A service: its aggregates and its projections, addressed by an import path (``module:name``).

Spark executors and CLI commands find the service by that path, so a service is defined once,
at module level::

    service = Service(
        name="inventory",
        aggregates={"product": Product},
        projections=[EventProjection("stock", fold_stock)],
    )
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from foldstream.domain import Aggregate, EventCodec, commands_of
from foldstream.errors import ConfigurationError, StoreNotFound
from foldstream.projections import Projection
from foldstream.projections.graph import bind
from foldstream.projections.versions import (
    check_versions,
    generation_of,
    named_by_version,
    version_name,
)
from foldstream.settings import AGGREGATE_STORE

if TYPE_CHECKING:
    from starlette.middleware import Middleware

    from foldstream.auth import Check


class DemoRecord(NamedTuple):
    """A record the demo writes to ``topic`` for a service's stores to fold: ``key``,
    ``value`` (None: a tombstone) and ``timestamp`` (epoch milliseconds; None: now)."""

    topic: str
    key: bytes
    value: bytes | None
    timestamp: int | None = None


@dataclass(frozen=True)
class DemoRecords:
    """What ``foldstream demo`` writes for a service whose stores read other producers'
    topics: it creates ``topics`` (``{topic: partitions}``) and writes what ``records(rng)``
    gives, partitioned as the stores reading each topic declare."""

    topics: Mapping[str, int]
    records: Callable[[random.Random], Iterable[DemoRecord]]


@dataclass(frozen=True)
class Service:
    """Everything that defines a service's behaviour (its environment is in ``Settings``).

    ``authentication``: who may send commands (and queries), checked on every request before
    its route (``docs/reference/http.md``): a check ``(request) -> bool`` (sync or async) for
    commands, ``Middleware(RequireCredentials, check=..., queries=True)``
    (:mod:`foldstream.auth`) to choose what it protects, or a Starlette ``Middleware`` of any
    class of your own.

    :attr:`codec` decodes the events of the service's own aggregates and of nothing else; its
    projections are given it (:meth:`Projection.for_events`), and so is its command side.
    :attr:`projections` also holds the hidden stores that forward events to multi-input stores
    (:func:`foldstream.projections.graph.bind`). ``demo``: the records ``foldstream demo``
    writes to other producers' topics (a service without commands has nothing else to show).
    """

    name: str
    aggregates: Mapping[str, type[Aggregate]] = field(default_factory=dict)
    projections: Sequence[Projection] = ()
    authentication: Check | Middleware | None = None
    codec: EventCodec = field(init=False, repr=False, compare=False)
    demo: DemoRecords | None = None

    def __post_init__(self) -> None:
        codec = EventCodec(self.aggregates.values())
        object.__setattr__(self, "codec", codec)
        declared = [named_by_version(p.for_events(codec)) for p in self.projections]
        check_versions(declared)
        object.__setattr__(self, "projections", bind(declared))
        stores = [p.store for p in self.projections]
        duplicated = {s for s in stores if stores.count(s) > 1}
        if duplicated:
            raise ConfigurationError(f"store names must be unique; repeated: {sorted(duplicated)}")
        if AGGREGATE_STORE in stores:
            raise ConfigurationError(
                f"store name {AGGREGATE_STORE!r} is reserved for the aggregate store: rename "
                "the projection"
            )
        for name, aggregate in self.aggregates.items():
            if not commands_of(aggregate):
                raise ConfigurationError(
                    f"aggregate {name!r} has no @command methods: mark the methods clients may call"
                )

    def projection(self, store: str) -> Projection:
        """The projection of ``store`` (a physical name); for a rebuild generation
        (``stock.v1.r2``, :mod:`foldstream.cluster.rebuilds`) the version's own under that
        name. :class:`StoreNotFound` when the service has none."""
        for projection in self.projections:
            if projection.store == store:
                return projection
        if generation_of(store) > 0:
            rebuilt = self.projection(version_name(store))
            return dataclasses.replace(rebuilt, store=store)  # type: ignore[type-var]
        raise StoreNotFound(
            f"no store named {store!r}; stores: {[p.store for p in self.projections]}"
        )


def load_service(path: str) -> Service:
    """Import ``module:attribute`` and check that it is a :class:`Service`."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"service path {path!r} must look like 'package.module:service'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r} for service {path!r}: {exc}"
        ) from exc
    service = getattr(module, attribute, None)
    if not isinstance(service, Service):
        raise ConfigurationError(
            f"{path!r} is not a foldstream Service (got {type(service).__name__})"
        )
    return service
