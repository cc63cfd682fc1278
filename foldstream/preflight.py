"""What an instance does before it serves: create its service's topics, then check the local
copies of its stores against them (:mod:`foldstream.stale_state`).

Kept apart from :mod:`foldstream.instance` (Starlette, Spark): ``foldstream serve`` runs it
before it starts the HTTP server, so that a state directory it refuses ends the command with
one ``error:`` line, and on granian before the worker process that builds the instance.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from foldstream.changelog import StoreLayout
from foldstream.errors import ConfigurationError
from foldstream.kafka import TopicSpec, ensure_topics, topic_partitions
from foldstream.service import Service
from foldstream.settings import Settings
from foldstream.stale_state import check_local_copies


def store_layouts(service: Service, settings: Settings) -> dict[str, StoreLayout]:
    """Each store's source and changelog topics."""
    events = settings.events_topic
    return {
        p.store: StoreLayout(
            p.source_topic(events), settings.changelog_topic(p.store), settings.on_stale_state
        )
        for p in service.projections
    }


def provision(service: Service, settings: Settings) -> dict[str, int]:
    """Create the service's topics; return ``{topic: partitions}`` of every source topic."""
    specs = [
        TopicSpec(settings.events_topic, settings.partitions),
        TopicSpec(settings.cluster_topic, 1, compact=True),
    ]
    specs += [
        TopicSpec(settings.changelog_topic(p.store), settings.partitions, compact=True)
        for p in service.projections
        if p.source_topic(settings.events_topic) == settings.events_topic
    ]
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    layout = {settings.events_topic: settings.partitions}
    for projection in service.projections:
        topic = projection.source_topic(settings.events_topic)
        if topic in layout:
            continue
        count = topic_partitions(admin, topic)
        if count is None:
            raise ConfigurationError(
                f"store {projection.store!r} reads topic {topic!r}, which does not exist"
            )
        layout[topic] = count
        specs.append(TopicSpec(settings.changelog_topic(projection.store), count, compact=True))
    ensure_topics(settings.bootstrap_servers, specs, replication_factor=settings.replication_factor)
    return layout


def prepare(service: Service, settings: Settings) -> dict[str, int]:
    """:func:`provision`, then check every local copy of the service's stores against its
    topics: copies that do not belong to them are rebuilt or refused (by the settings'
    ``on_stale_state``). Returns what :func:`provision` does; idempotent."""
    layout = provision(service, settings)
    copies = [
        store.local_copy(settings.state_dir, name, partition)
        for name, store in store_layouts(service, settings).items()
        for partition in range(layout[store.source_topic])
    ]
    check_local_copies(settings.bootstrap_servers, copies, settings.on_stale_state)
    return layout
