"""What an instance does before it serves: check its state directory and Java, create its
service's topics (Kafka must answer), then check the local copies of its stores against them
(:mod:`foldstream.stale_state`).

Kept apart from :mod:`foldstream.instance` (Starlette, Spark): ``foldstream serve`` runs it
before it starts the HTTP server, so that a state directory it refuses ends the command with
one ``error:`` line, and on granian before the worker process that builds the instance.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from foldstream.changelog import StoreLayout
from foldstream.cluster.version_cleanup import RETIRED_DIR, retired_stores
from foldstream.errors import ConfigurationError
from foldstream.generations import every_projection, store_layout
from foldstream.kafka_client import configure as configure_kafka_clients
from foldstream.projections import Projection
from foldstream.projections.versions import logical_name
from foldstream.service import Service
from foldstream.settings import AGGREGATE_STORE, Settings
from foldstream.stale_state import check_local_copies
from foldstream.topics import provision


class BadStateDirectory(ConfigurationError):
    """The state directory cannot hold the instance's stores.

    Remedy: point ``--state-dir`` (``FOLDSTREAM_STATE_DIR``) at a directory this user can write,
    on a local disk with room for the stores.
    """


def check_state_dir(path: Path) -> None:
    """Create ``path`` if missing and check that files can be written in it."""
    where = f"state directory {str(path)!r}"
    if path.exists() and not path.is_dir():
        raise BadStateDirectory(f"{where} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadStateDirectory(f"cannot create {where}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise BadStateDirectory(f"{where} is not writable by this user")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".foldstream-check-"):
            pass
    except OSError as exc:
        raise BadStateDirectory(f"cannot write in {where}: {exc.strerror or exc}") from None


def kept_projections(service: Service, settings: Settings) -> list[Projection]:
    """The service's projections and its rebuild generations
    (:func:`foldstream.generations.every_projection`) but the store versions retired in the
    state directory (:mod:`foldstream.cluster.version_cleanup`): neither their topics nor their
    queries come back. :class:`ConfigurationError` when every declared version of a store is
    retired (code rolled back past a switch)."""
    retired = retired_stores(settings.state_dir)
    kept = [p for p in every_projection(service, settings) if p.store not in retired]
    declared = {logical_name(p.store): p.store for p in service.projections}
    lost = sorted(name for name in declared if all(logical_name(p.store) != name for p in kept))
    if lost:
        raise ConfigurationError(
            f"every declared version of stores {lost} is retired in {settings.state_dir}: a "
            "newer version answers them. Declare that newer version again, or delete "
            f"{settings.state_dir / RETIRED_DIR}/<store> to build the retired one anew"
        )
    return kept


def store_layouts(service: Service, settings: Settings) -> dict[str, StoreLayout]:
    """Each store's source and changelog topics, and its partitions' format: the projections'
    stores (every declared version and rebuild generation, retired ones too), and for a
    service with aggregates the aggregate store (one more store of the events topic)."""
    events = settings.events_topic
    layouts = {p.store: store_layout(settings, p) for p in every_projection(service, settings)}
    if service.aggregates:
        changelog = settings.changelog_topic(AGGREGATE_STORE)
        layouts[AGGREGATE_STORE] = StoreLayout(
            events, changelog, settings.on_stale_state, follows_source=False, mapped_reads=False
        )
    return layouts


def prepare(service: Service, settings: Settings) -> dict[str, int]:
    """Install the Kafka client properties, create (or check) the service's topics
    (:func:`foldstream.topics.provision`), then check every local copy of the service's stores
    against them: copies that do not belong to them are rebuilt or refused (by the settings'
    ``on_stale_state``). Returns ``{topic: partitions}`` of every source topic; idempotent.

    A bad client property, an unreachable broker, a rejected credential, a missing topic or a
    refused state directory is one error, before anything serves; so are a state directory that
    cannot be written and a missing Java, checked first."""
    from foldstream.spark import check_java

    check_state_dir(settings.state_dir)
    check_java()
    configure_kafka_clients(settings.kafka_config)
    projections = kept_projections(service, settings)
    layout = provision(settings, projections, aggregates=bool(service.aggregates))
    kept = {p.store for p in projections} | {AGGREGATE_STORE}
    copies = [
        store.local_copy(settings.state_dir, name, partition)
        for name, store in store_layouts(service, settings).items()
        if name in kept
        for partition in range(layout[store.source_topic])
    ]
    check_local_copies(settings.bootstrap_servers, copies, settings.on_stale_state)
    return layout
