"""What an instance does before it serves: create its service's topics, then check the local
copies of its stores against them (:mod:`foldstream.stale_state`).

Kept apart from :mod:`foldstream.instance` (Starlette, Spark): ``foldstream serve`` runs it
before it starts the HTTP server, so that a state directory it refuses ends the command with
one ``error:`` line, and on granian before the worker process that builds the instance.
"""

from __future__ import annotations

from foldstream.changelog import StoreLayout
from foldstream.kafka_client import configure as configure_kafka_clients
from foldstream.service import Service
from foldstream.settings import Settings
from foldstream.stale_state import check_local_copies
from foldstream.topics import provision


def store_layouts(service: Service, settings: Settings) -> dict[str, StoreLayout]:
    """Each store's source and changelog topics, and its partitions' format."""
    events = settings.events_topic
    return {
        p.store: StoreLayout(
            p.source_topic(events),
            settings.changelog_topic(p.store),
            settings.on_stale_state,
            p.table_format,
        )
        for p in service.projections
    }


def prepare(service: Service, settings: Settings) -> dict[str, int]:
    """Install the Kafka client properties, create (or check) the service's topics
    (:func:`foldstream.topics.provision`), then check every local copy of the service's stores
    against them: copies that do not belong to them are rebuilt or refused (by the settings'
    ``on_stale_state``). Returns ``{topic: partitions}`` of every source topic; idempotent.

    A bad client property, a rejected credential, a missing topic or a refused state directory
    is one error, before anything serves."""
    configure_kafka_clients(settings.kafka_config)
    layout = provision(settings, service.projections)
    copies = [
        store.local_copy(settings.state_dir, name, partition)
        for name, store in store_layouts(service, settings).items()
        for partition in range(layout[store.source_topic])
    ]
    check_local_copies(settings.bootstrap_servers, copies, settings.on_stale_state)
    return layout
