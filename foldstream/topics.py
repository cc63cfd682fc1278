"""The topics a service needs, provisioned (or, on a locked-down cluster, checked) before an
instance starts anything that uses them, with the ACLs its Kafka principal needs on them
(:mod:`foldstream.kafka_acls`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from foldstream.errors import ConfigurationError
from foldstream.kafka import TopicSpec, ensure_topics, topic_partitions
from foldstream.kafka_acls import AccessCheck
from foldstream.kafka_client import admin_client, wait_for_cluster
from foldstream.projections.joins import Join
from foldstream.settings import AGGREGATE_STORE

if TYPE_CHECKING:
    from foldstream.projections.projection import Projection
    from foldstream.settings import Settings


def provision(
    settings: Settings, projections: Sequence[Projection], *, aggregates: bool = False
) -> dict[str, int]:
    """Create the service's topics that are missing (or, with ``settings.create_topics``
    false, fail naming them); return ``{topic: partitions}`` of every source topic (the
    repartition topics of multi-input stores among them). With ``aggregates`` (the service has
    aggregates), the aggregate store's changelog too.

    Fails at once, with one clear error, when the cluster rejects the client's credentials or
    TLS settings (:func:`~foldstream.kafka_client.wait_for_cluster`), or when the client's
    principal lacks an ACL the service needs (:class:`~foldstream.kafka_acls.MissingAcl`)."""
    wait_for_cluster(settings.bootstrap_servers, settings.broker_wait_s)
    access = AccessCheck(
        service=settings.service,
        bootstrap=settings.bootstrap_servers,
        timeout=settings.broker_wait_s,
    )
    access.check_principal()
    access.check_foreign_topics(foreign_topics(settings, projections))
    specs, layout = service_topics(settings, projections, aggregates=aggregates)
    missing = access.check_service_topics(specs, create=settings.create_topics)
    ensure_service_topics(settings, specs)
    access.check_created(missing)
    return layout


def foreign_topics(settings: Settings, projections: Sequence[Projection]) -> set[str]:
    """The topics of other producers the service's stores read."""
    return {
        topic
        for projection in projections
        if (topic := projection.source_topic(settings.events_topic)) != settings.events_topic
        and not isinstance(projection, Join)
    }


def service_topics(
    settings: Settings, projections: Sequence[Projection], *, aggregates: bool
) -> tuple[list[TopicSpec], dict[str, int]]:
    """The service's own topics, and ``{topic: partitions}`` of every source topic (other
    producers' topics must exist: their partitions decide the changelogs')."""
    specs = [
        TopicSpec(settings.events_topic, settings.partitions),
        TopicSpec(settings.cluster_topic, 1, compact=True),
    ]
    admin = admin_client(settings.bootstrap_servers)
    layout = {settings.events_topic: settings.partitions}
    for projection in projections:
        topic = projection.source_topic(settings.events_topic)
        if topic not in layout and isinstance(projection, Join):
            # A multi-input store's repartition topic is the service's own.
            specs.append(TopicSpec(topic, projection.partitions or settings.partitions))
            layout[topic] = specs[-1].partitions
        elif topic not in layout:
            count = topic_partitions(admin, topic)
            if count is None:
                raise ConfigurationError(
                    f"store {projection.store!r} reads topic {topic!r}, which does not exist"
                )
            layout[topic] = count
        # Every store its own, also when several read one topic.
        specs += store_topics(settings, projection.store, layout[topic])
    if aggregates:
        changelog = settings.changelog_topic(AGGREGATE_STORE)
        specs.append(TopicSpec(changelog, settings.partitions, compact=True))
    return specs, layout


def ensure_service_topics(settings: Settings, specs: list[TopicSpec]) -> None:
    """Create ``specs`` as ``settings`` say (replication, ``min.insync.replicas``), or with
    ``create_topics`` false check that they exist."""
    ensure_topics(
        settings.bootstrap_servers,
        specs,
        replication_factor=settings.replication_factor,
        min_insync_replicas=settings.min_insync_replicas,
        create=settings.create_topics,
    )


def store_topics(settings: Settings, store: str, partitions: int) -> list[TopicSpec]:
    """A store's changelog (compacted) and dead-letter topic, as many partitions as its
    source topic."""
    return [
        TopicSpec(settings.changelog_topic(store), partitions, compact=True),
        TopicSpec(settings.dead_letter_topic(store), partitions),
    ]
