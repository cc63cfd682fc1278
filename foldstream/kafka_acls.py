"""The ACLs an instance's Kafka principal needs where the cluster authorizes requests, and the
check at start that it has each: one error naming the missing ACL and the ``kafka-acls.sh``
command that grants it, instead of an instance that never becomes ready.

The list (docs/operations/kafka.md, "ACLs"): on the topics prefixed ``<service>.`` Read, Write,
DescribeConfigs, and Create unless the topics are created beforehand; Read on each topic of
another producer that a store reads; Write on the transactional ids prefixed ``<service>.``;
Describe on the group :data:`~foldstream.kafka.UNUSED_GROUP_ID`.

Each is checked without touching the service's data or its writers:

- topics: the operations the broker says the principal may perform on each (the authorized
  operations of a topic's description); a topic still to create, by a creation that is only
  validated;
- the group: by describing it (the coordinator lookup every consumer makes needs the same);
- the transactional ids: by a producer initialising transactions as :data:`PROBE_SUFFIX`
  under the prefix. Nothing else tells a client whether it may write a transactional id, and
  initialising one of the service's own would fence the writer holding it; so ACLs naming
  each id literally fail the check: grant the prefixed one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AclOperation

from foldstream.errors import BrokerUnavailable, ConfigurationError
from foldstream.kafka import UNUSED_GROUP_ID, producer_config
from foldstream.kafka_client import admin_client, installed
from foldstream.kafka_topics import TopicSpec

log = logging.getLogger(__name__)

#: The transactional id the check initialises, after the service's prefix: never a writer's.
PROBE_SUFFIX = "preflight"
#: How long a probe waits for an answer that is not a denial. A denial comes at once; an
#: allowed answer waits for the coordinator of the group or transactional id, which a new
#: cluster creates on first use (its internal topic), and nothing else at start needs it.
PROBE_TIMEOUT_S = 5.0
#: What ``kafka-acls.sh --command-config`` is given in the commands shown: an administrator's
#: client properties (the instance's principal may not grant ACLs).
ADMIN_CONFIG = "admin.properties"
#: The principal of credentials whose principal the instance cannot tell (Kerberos, TLS
#: certificates, OAUTHBEARER tokens: the brokers derive it).
UNKNOWN_PRINCIPAL = "User:<principal>"

_OPERATIONS = {
    "Read": AclOperation.READ,
    "Write": AclOperation.WRITE,
    "Create": AclOperation.CREATE,
    "Describe": AclOperation.DESCRIBE,
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
}
_PLURALS = {"topic": "topics", "group": "groups", "transactional-id": "transactional ids"}
#: Where librdkafka's log lines of the probes go: nowhere (in no hierarchy, no handler).
_SILENT = logging.Logger("foldstream.kafka_acls.probe")
_SILENT.addHandler(logging.NullHandler())
_AUTHORIZATION_FAILED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}


@dataclass(frozen=True)
class Acl:
    """One ALLOW ACL: ``operation`` (as ``kafka-acls.sh`` spells it) on the ``resource``
    (``kafka-acls.sh``'s option: ``topic``, ``group``, ``transactional-id``) named ``name``,
    or on every one whose name starts with it when ``prefixed``."""

    resource: str
    name: str
    operation: str
    prefixed: bool = False

    def __str__(self) -> str:
        if self.prefixed:
            return f"{self.operation} on {_PLURALS[self.resource]} prefixed {self.name!r}"
        return f"{self.operation} on {self.resource} {self.name!r}"

    def grant_command(self, bootstrap: str, principal: str) -> str:
        """The ``kafka-acls.sh`` command that grants it to ``principal``."""
        words = [
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config {ADMIN_CONFIG}",
            f"--add --allow-principal {principal} --operation {self.operation}",
            f"--{self.resource} {self.name}",
        ]
        if self.prefixed:
            words.append("--resource-pattern-type prefixed")
        return " ".join(words)


def principal_of(properties: Mapping[str, str]) -> str:
    """The principal the brokers give a client with ``properties``, where the client can tell:
    a PLAIN or SCRAM user's name, ``User:ANONYMOUS`` without authentication."""
    protocol = properties.get("security.protocol", "plaintext").lower()
    mechanism = properties.get("sasl.mechanism", "GSSAPI").upper()
    if protocol.startswith("sasl") and mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        return f"User:{properties.get('sasl.username', '')}"
    if protocol == "plaintext":
        return "User:ANONYMOUS"
    return UNKNOWN_PRINCIPAL


class MissingAcl(ConfigurationError):
    """The instance's Kafka principal lacks ACLs the service needs.

    Remedy: grant each one named, as an administrator, with the ``kafka-acls.sh`` command the
    message gives (docs/operations/kafka.md lists them all).
    """

    def __init__(self, missing: Sequence[tuple[Acl, str]], bootstrap: str, principal: str):
        self.acls = [acl for acl, _ in missing]
        lacked = "; ".join(f"{acl} ({evidence})" for acl, evidence in missing)
        commands = "; ".join(acl.grant_command(bootstrap, principal) for acl, _ in missing)
        some = "an ACL" if len(missing) == 1 else f"{len(missing)} ACLs"
        super().__init__(
            f"the Kafka principal {principal} lacks {some} the service needs: {lacked}. Grant "
            f"{'it' if len(missing) == 1 else 'them'} as an administrator ({ADMIN_CONFIG}: an "
            "administrator's client properties; docs/operations/kafka.md lists every ACL): "
            f"{commands}"
        )


@dataclass(frozen=True)
class TopicAccess:
    """What describing a topic told: whether it exists, whether the principal may describe it,
    and the operations the broker says it may perform on it (None: not told)."""

    exists: bool
    describable: bool = True
    operations: frozenset[AclOperation] | None = None


class AccessCheck:
    """The checks of an instance's start (see the module's docstring), each raising
    :class:`MissingAcl` for what its principal lacks."""

    def __init__(self, *, service: str, bootstrap: str, timeout: float) -> None:
        self.service = service
        self.prefix = f"{service}."
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.principal = principal_of(installed())

    def check_principal(self) -> None:
        """The group and the transactional ids, which need no topic. Asked at once: on a new
        cluster each waits for a coordinator of its own (see :data:`PROBE_TIMEOUT_S`)."""
        probe = f"{self.prefix}{PROBE_SUFFIX}"
        with ThreadPoolExecutor(2, thread_name_prefix="acl-probe") as pool:
            group = pool.submit(self._group_denied)
            transactional = pool.submit(self._transactional_id_denied, probe)
            group_denied, transactional_denied = group.result(), transactional.result()
        missing = []
        if group_denied:
            missing.append((Acl("group", UNUSED_GROUP_ID, "Describe"), "describing it was denied"))
        if transactional_denied:
            acl = Acl("transactional-id", self.prefix, "Write", prefixed=True)
            missing.append((acl, f"initialising transactions as {probe!r} was denied"))
        self._raise_if(missing)

    def check_foreign_topics(self, topics: Iterable[str]) -> None:
        """Read on each topic of another producer a store reads (a missing one is left to the
        caller: it names the store)."""
        self._raise_if(self._lacking(self._describe(topics), lambda _: ["Read"]))

    def check_service_topics(self, specs: Sequence[TopicSpec], *, create: bool) -> list[TopicSpec]:
        """The operations on the service's topics that exist, and Create for those to create
        when ``create``; returns the specs of the topics that do not exist yet."""
        by_name = {spec.name: spec for spec in specs}
        access = self._describe(by_name)
        missing = [by_name[t] for t, a in access.items() if a.describable and not a.exists]
        lacking = self._lacking(access, lambda topic: _operations_on(by_name[topic]))
        if create and missing and not lacking:
            lacking = self._creation_refused(missing)
        self._raise_if(lacking)
        return missing

    def check_created(self, specs: Sequence[TopicSpec]) -> None:
        """The operations on topics the instance has just created."""
        by_name = {spec.name: spec for spec in specs}
        access = self._describe(by_name)
        self._raise_if(self._lacking(access, lambda topic: _operations_on(by_name[topic])))

    def _raise_if(self, missing: list[tuple[Acl, str]]) -> None:
        if missing:
            raise MissingAcl(missing, self.bootstrap, self.principal)

    def _acl(self, topic: str, operation: str) -> Acl:
        if topic.startswith(self.prefix):
            return Acl("topic", self.prefix, operation, prefixed=True)
        return Acl("topic", topic, operation)

    def _lacking(
        self, access: Mapping[str, TopicAccess], needed: Callable[[str], Sequence[str]]
    ) -> list[tuple[Acl, str]]:
        """The ACLs ``access`` shows missing (each once, with the first topic showing it)."""
        found: dict[Acl, str] = {}
        for topic, seen in sorted(access.items()):
            if not seen.describable:
                # Read and Write each imply Describe: neither is granted.
                for operation in [op for op in ("Read", "Write") if op in needed(topic)]:
                    found.setdefault(self._acl(topic, operation), f"{topic} is not described")
                continue
            if seen.operations is None:
                continue  # a broker that does not tell: the clients' errors will
            for operation in needed(topic):
                if _OPERATIONS[operation] not in seen.operations:
                    found.setdefault(self._acl(topic, operation), f"not granted on {topic}")
        return list(found.items())

    def _describe(self, topics: Iterable[str]) -> dict[str, TopicAccess]:
        names = sorted(set(topics))
        if not names:
            return {}
        admin = admin_client(self.bootstrap)
        futures = admin.describe_topics(
            TopicCollection(names),
            include_authorized_operations=True,
            request_timeout=self.timeout,
        )
        return {topic: _access(topic, future, self.timeout) for topic, future in futures.items()}

    def _creation_refused(self, specs: Sequence[TopicSpec]) -> list[tuple[Acl, str]]:
        """Create, when a creation only validated is refused for lack of it."""
        admin = admin_client(self.bootstrap)
        futures = admin.create_topics(
            [spec.new_topic(None) for spec in specs],
            validate_only=True,
            request_timeout=self.timeout,
        )
        for topic, future in sorted(futures.items()):
            error = _kafka_error(future, self.timeout)
            if error is not None and error.code() in _AUTHORIZATION_FAILED:
                return [(self._acl(topic, "Create"), f"creating {topic} was denied")]
        return []  # other refusals are the creation's to report, with their remedies

    def _group_denied(self) -> bool:
        """Whether describing the group is denied. Its coordinator lookup is authorized before
        anything else: a coordinator not there yet (a new cluster creates ``__consumer_offsets``
        on first use) delays an allowed answer, never a denial, and is not waited for."""
        admin = admin_client(self.bootstrap)
        timeout = min(self.timeout, PROBE_TIMEOUT_S)
        future = admin.describe_consumer_groups([UNUSED_GROUP_ID], request_timeout=timeout)
        error = _kafka_error(future[UNUSED_GROUP_ID], timeout)
        if error is not None and error.code() != KafkaError.GROUP_AUTHORIZATION_FAILED:
            log.debug("describing the group %s: %s (not denied)", UNUSED_GROUP_ID, error.str())
        return error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    def _transactional_id_denied(self, transactional_id: str) -> bool:
        """Whether initialising transactions as ``transactional_id`` is denied: authorized
        before the transaction coordinator is asked, so, as for the group, a coordinator not
        ready yet is not waited for."""
        config: dict[str, Any] = producer_config(
            self.bootstrap, linger_ms=0, **{"transactional.id": transactional_id}
        )
        # librdkafka would print the denial as a fatal error of its own: the answer is ours.
        config["logger"] = _SILENT
        producer = Producer(config)
        try:
            producer.init_transactions(min(self.timeout, PROBE_TIMEOUT_S))
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                return True
            log.debug("initialising %s: %s (not denied)", transactional_id, error.str())
        finally:
            del producer  # a fatal error's traceback would keep it (and its threads) alive
        return False


def _operations_on(spec: TopicSpec) -> list[str]:
    """The service reads and writes each of its topics; the compaction check describes the
    configs of the compacted ones (changelogs, the cluster map)."""
    return ["Read", "Write"] + (["DescribeConfigs"] if spec.compact else [])


def _access(topic: str, future: object, timeout: float) -> TopicAccess:
    error = _kafka_error(future, timeout)
    if error is None:
        described = future.result()  # type: ignore[attr-defined]
        operations = described.authorized_operations
        return TopicAccess(True, operations=None if operations is None else frozenset(operations))
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return TopicAccess(False, describable=False)
    if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return TopicAccess(False)
    raise BrokerUnavailable(f"cannot describe topic {topic!r}: {error.str()}")


def _kafka_error(future: object, timeout: float) -> KafkaError | None:
    """The error a future ended with (a time-out as ``_TIMED_OUT``), or None."""
    try:
        error = future.exception(timeout=timeout)  # type: ignore[attr-defined]
    except TimeoutError:
        return KafkaError(KafkaError._TIMED_OUT)
    if error is None:
        return None
    if isinstance(error, KafkaException) and isinstance(error.args[0], KafkaError):
        return error.args[0]
    raise BrokerUnavailable(f"unexpected answer from the cluster: {error!r}")
