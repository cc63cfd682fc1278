"""Kafka topics: creating the ones a service needs (:func:`ensure_topics`, or naming them and
how to create them), checking their partition counts and that changelogs are compacted, and
reading their partition counts and topic ids."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from foldstream.errors import BrokerUnavailable, ConfigurationError
from foldstream.kafka_client import admin_client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    """A topic the service needs; ``compact`` makes it a changelog (latest value per key)."""

    name: str
    partitions: int
    compact: bool = False
    config: dict[str, str] = field(default_factory=dict)

    def topic_config(self, min_insync_replicas: int | None = None) -> dict[str, str]:
        """The topic's configuration at creation."""
        config = dict(self.config)
        if self.compact:
            config["cleanup.policy"] = "compact"
        if min_insync_replicas is not None:
            config["min.insync.replicas"] = str(min_insync_replicas)
        return config

    def new_topic(
        self, replication_factor: int | None, min_insync_replicas: int | None = None
    ) -> NewTopic:
        """The topic to create; ``replication_factor`` None leaves it to the brokers' default
        (``default.replication.factor``)."""
        return NewTopic(
            self.name,
            num_partitions=self.partitions,
            replication_factor=-1 if replication_factor is None else replication_factor,
            config=self.topic_config(min_insync_replicas),
        )

    def create_command(
        self, bootstrap: str, replication_factor: int | None, min_insync_replicas: int | None
    ) -> str:
        """Kafka's ``kafka-topics.sh`` command that creates the topic as foldstream would."""
        words = [
            f"kafka-topics.sh --bootstrap-server {bootstrap} --create --topic {self.name}",
            f"--partitions {self.partitions}",
        ]
        if replication_factor is not None:
            words.append(f"--replication-factor {replication_factor}")
        words += [f"--config {k}={v}" for k, v in self.topic_config(min_insync_replicas).items()]
        return " ".join(words)


def topic_partitions(admin: AdminClient, topic: str, timeout: float = 10.0) -> int | None:
    """How many partitions ``topic`` has, or None when it does not exist."""
    return _partition_counts(admin, timeout).get(topic)


def _partition_counts(admin: AdminClient, timeout: float = 10.0) -> dict[str, int]:
    # Listing all topics: a metadata request naming the topic may auto-create it with defaults.
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailable(f"cannot read the cluster's topics: {exc}") from exc
    return {
        name: len(described.partitions)
        for name, described in metadata.topics.items()
        if described.error is None and described.partitions
    }


#: Kafka's topic id of "no id" (a broker that keeps none).
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
_UNKNOWN_TOPIC = KafkaError.UNKNOWN_TOPIC_OR_PART


def topic_ids(
    bootstrap: str, topics: Iterable[str], timeout: float = 10.0
) -> dict[str, str | None]:
    """``{topic: id}`` of the ``topics`` that exist (missing ones are left out); the id is
    None where the broker keeps none.

    A topic deleted and created again gets a new id, so a copy of its data that recorded the
    id it was made from can tell.
    """
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    admin = admin_client(bootstrap)
    futures = admin.describe_topics(TopicCollection(wanted), request_timeout=timeout)
    ids: dict[str, str | None] = {}
    for topic, future in futures.items():
        # exception() rather than result(): a raised error would keep this frame (and the
        # admin client in it) alive through its traceback until the garbage collector runs.
        try:
            error = future.exception(timeout=timeout)
        except TimeoutError:
            error = KafkaException(KafkaError(KafkaError._TIMED_OUT))
        if error is not None:
            if isinstance(error, KafkaException) and error.args[0].code() == _UNKNOWN_TOPIC:
                continue
            raise BrokerUnavailable(f"cannot describe topic {topic!r}: {error}")
        found = future.result().topic_id
        ids[topic] = None if found is None or str(found) == _NO_TOPIC_ID else str(found)
    return ids


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec],
    *,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
    create: bool = True,
    timeout: float = 30.0,
) -> None:
    """Create the topics that are missing (or, with ``create`` false, fail naming them and how
    to create them); check that existing ones have the expected partitions, and that existing
    changelogs are compacted.

    ``replication_factor`` and ``min_insync_replicas`` apply to the topics created here (None:
    the brokers' defaults). Idempotent: safe to call at every start, from every instance.
    """
    admin = admin_client(bootstrap)
    wanted = list(specs)
    existing = _partition_counts(admin)
    missing = [s for s in wanted if s.name not in existing]
    if missing and not create:
        raise _missing_topics(bootstrap, missing, replication_factor, min_insync_replicas)
    if missing:
        _create_topics(admin, missing, replication_factor, min_insync_replicas, timeout)
        existing = _listed(admin, [s.name for s in missing], timeout)
    for spec in wanted:
        actual = existing.get(spec.name)
        if actual != spec.partitions:
            raise ConfigurationError(
                f"topic {spec.name!r} has {actual} partitions but the service expects "
                f"{spec.partitions}; keys would be routed to the wrong partitions. Use the "
                "topic's partition count in the settings, or recreate the topic"
            )
    _check_compacted(admin, [s for s in wanted if s.compact and s not in missing])


def _listed(admin: AdminClient, created: list[str], timeout: float) -> dict[str, int]:
    """The partition counts of the cluster's topics once ``created`` are all listed: a topic
    the controller created reaches the brokers' metadata a moment later."""

    def unlisted(counts: dict[str, int]) -> bool:
        return any(name not in counts for name in created)

    try:
        return Retrying(  # type: ignore[no-any-return]
            stop=stop_after_delay(timeout),
            wait=wait_fixed(0.05),
            retry=retry_if_result(unlisted),
        )(_partition_counts, admin)
    except RetryError as exc:
        raise BrokerUnavailable(
            f"topics {created} were created but the cluster did not list them within "
            f"{timeout}s: check the brokers' logs"
        ) from exc


def _missing_topics(
    bootstrap: str,
    missing: list[TopicSpec],
    replication_factor: int | None,
    min_insync_replicas: int | None,
) -> ConfigurationError:
    commands = "\n".join(
        f"  {s.create_command(bootstrap, replication_factor, min_insync_replicas)}" for s in missing
    )
    return ConfigurationError(
        f"{len(missing)} topic(s) the service needs do not exist and topic creation is off "
        f"(--no-create-topics): {', '.join(s.name for s in missing)}. Create them, e.g. with "
        f"(add --command-config with the client properties on a secured cluster):\n{commands}"
    )


#: Why a cluster refuses to create a topic, for errors that no retry mends.
_CREATE_REMEDIES = {
    KafkaError.INVALID_REPLICATION_FACTOR: "use a --replication-factor no larger than the "
    "cluster's broker count",
    KafkaError.INVALID_CONFIG: "check --min-insync-replicas (at most the replication factor)",
    KafkaError.POLICY_VIOLATION: "the cluster's topic policy refuses these settings",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "the client may not create topics: create them "
    "beforehand and start with --no-create-topics",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the client may not create topics: create them "
    "beforehand and start with --no-create-topics",
}


def _create_topics(
    admin: AdminClient,
    missing: list[TopicSpec],
    replication_factor: int | None,
    min_insync_replicas: int | None,
    timeout: float,
) -> None:
    futures = admin.create_topics(
        [s.new_topic(replication_factor, min_insync_replicas) for s in missing],
        operation_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            remedy = _CREATE_REMEDIES.get(error.code())
            if remedy is not None:
                raise ConfigurationError(
                    f"the cluster refused to create topic {name!r}: {error.str()}; {remedy}"
                ) from None
            raise BrokerUnavailable(f"cannot create topic {name!r}: {exc}") from exc


def _check_compacted(admin: AdminClient, specs: list[TopicSpec], timeout: float = 10.0) -> None:
    """Fail when an existing changelog is not compacted: deleting old segments would lose keys
    that a restore needs. Brokers that do not describe topic configs pass unchecked."""
    if not specs:
        return
    resources = [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in specs]
    for resource, future in admin.describe_configs(resources).items():
        try:
            config = future.result(timeout=timeout)
        except KafkaException as exc:
            log.warning("cannot check the cleanup.policy of %s: %s", resource.name, exc)
            continue
        policy = config.get("cleanup.policy")
        if policy is not None and "compact" not in str(policy.value).split(","):
            raise ConfigurationError(
                f"topic {resource.name!r} has cleanup.policy={policy.value}, but changelogs "
                "must be compacted or restores lose keys: kafka-configs.sh --alter --entity-type "
                f"topics --entity-name {resource.name} --add-config cleanup.policy=compact"
            )
