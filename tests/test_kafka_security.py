"""Instances on a secured cluster, and topics for production, on a real broker.

The secured cluster is Apache Kafka serving SASL_SSL itself: SCRAM-SHA-512 over TLS with a CA
made here, and ``StandardAuthorizer`` (:mod:`tests.secured_kafka`). The instance logs in as
:data:`USER` with exactly the ACLs docs/operations/kafka.md lists, read from that page (so the
page cannot drift from what works), and the tests take each of them away in turn.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from foldstream import kafka_client
from foldstream.broker import KafkaCluster
from foldstream.errors import ConfigurationError
from foldstream.examples.inventory import service as inventory
from foldstream.kafka import TopicSpec, ensure_topics, read_to_end
from foldstream.kafka_acls import MissingAcl
from foldstream.process import InstanceProcess, http
from foldstream.projections import LatestValue
from foldstream.settings import Settings
from foldstream.testing.kafka import delete_topics_where
from foldstream.testing.steps import wait_until
from foldstream.topics import provision
from tests.secured_kafka import ADMIN, SecuredCluster, secured_cluster, set_acls

USER = "svc-inventory"
PASSWORD = "hunter2-s3cret"
PRINCIPAL = f"User:{USER}"
SERVICE = "inventory"
DOCS = Path(__file__).parents[1] / "docs" / "operations" / "kafka.md"


def documented_acls() -> list[tuple[str, str]]:
    """``(operation, command)`` of each ACL the docs' "ACLs" section grants, the command
    granting that operation alone (the docs' example service and principal replaced by
    :data:`SERVICE` and :data:`PRINCIPAL`, its bootstrap by ``{bootstrap}``)."""
    section = DOCS.read_text().split("\n## ACLs\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("\n```", 1)[0]
    replaced = {
        "User:svc-orders": PRINCIPAL,
        "orders.": f"{SERVICE}.",
        "broker-1:9093": "{bootstrap}",
    }
    acls = []
    for line in block.splitlines():
        words = [replaced.get(word, word) for word in shlex.split(line)]
        operations = [words[n + 1] for n, word in enumerate(words) if word == "--operation"]
        others = [w for n, w in enumerate(words) if "--operation" not in (w, words[n - 1])]
        at = others.index(PRINCIPAL) + 1
        for operation in operations:
            command = " ".join([*others[:at], "--operation", operation, *others[at:]])
            acls.append((operation, command))
    return acls


DOCUMENTED = documented_acls()


def binding(command: str) -> AclBinding:
    """The ACL a one-operation ``kafka-acls.sh --add`` command grants."""
    words = shlex.split(command)
    option = {w: words[n + 1] for n, w in enumerate(words[:-1]) if w.startswith("--")}
    resource = next(r for r in ("topic", "group", "transactional-id") if f"--{r}" in option)
    prefixed = option.get("--resource-pattern-type") == "prefixed"
    return AclBinding(
        ResourceType[resource.upper().replace("-", "_")],
        option[f"--{resource}"],
        ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL,
        option["--allow-principal"],
        "*",
        AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", option["--operation"]).upper()],
        AclPermissionType.ALLOW,
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredCluster]:
    with secured_cluster(tmp_path_factory.mktemp("secured"), {USER: PASSWORD}) as cluster:
        yield cluster


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[KafkaCluster]:
    """A broker of its own: the service's topics exist on the session's after other tests."""
    with KafkaCluster(data_dir=tmp_path / "kafka") as running:
        yield running


def _failed_start(bootstrap: str, tmp_path: Path, **options: Any) -> tuple[str, str]:
    """The one error line, and the whole log, of an instance (``InstanceProcess`` with
    ``options``) that must stop before serving anything."""
    instance = InstanceProcess(
        bootstrap=bootstrap, state_dir=tmp_path / "state", partitions=2, **options
    )
    with instance:
        assert instance.process is not None
        code = instance.process.wait(timeout=120)
    log = instance.log_path.read_text()
    assert code == 2, log
    assert "Traceback" not in log, log
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log
    return errors[0], log


def test_the_docs_list_acls_of_topics_transactional_ids_and_the_group() -> None:
    """What the tests below grant, read from the docs (a parse that found nothing would make
    them pass vacuously)."""
    assert [operation for operation, _ in DOCUMENTED] == [
        "Read",
        "Write",
        "DescribeConfigs",
        "Create",
        "Write",
        "Describe",
    ]


def test_an_instance_serves_with_exactly_the_documented_acls(
    secured: SecuredCluster, tmp_path: Path, client_properties: None
) -> None:
    """Logged in with ``KAFKA_*`` variables as a user with only the documented ACLs, an
    instance creates its topics, accepts a command and answers its lookup: the command writer,
    the cluster's leader, the Spark task's consumer and changelog producer and the tailing
    consumers all went through SASL_SSL and the authorizer."""
    granted = {binding(command.format(bootstrap=secured.bootstrap)) for _, command in DOCUMENTED}
    set_acls(secured, granted)
    instance = InstanceProcess(
        bootstrap=secured.bootstrap,
        state_dir=tmp_path / "state",
        partitions=2,
        env=secured.environment(USER),
    )
    with instance:
        instance.wait_ready(timeout=600)  # generous: a JVM start on a shared, loaded machine
        status, body = http(
            "POST", f"{instance.url}/commands/product/sku-acl/receive_shipment", {"quantity": 5}
        )
        assert status == 200, body
        wait_until(
            lambda: (
                http("GET", f"{instance.url}/stores/stock/keys/sku-acl")[1].get("value")
                == {"on_hand": 5}
            ),
            lambda: f"lookup: {http('GET', f'{instance.url}/stores/stock/keys/sku-acl')}",
        )
    log = instance.log_path.read_text()
    assert PASSWORD not in log
    assert f"sasl.password=***, sasl.username={USER}" in log
    # The test's own helpers reach the cluster with the same client properties.
    kafka_client.install(secured.client_properties(USER))
    events = read_to_end(secured.bootstrap, f"{SERVICE}.events", 2)
    assert {m.key() for batch in events for m in batch} == {b"sku-acl"}


@pytest.mark.parametrize(
    ("operation", "command"), DOCUMENTED, ids=[c.split("--operation ")[1] for _, c in DOCUMENTED]
)
def test_a_missing_acl_stops_an_instance_at_start_naming_it(
    secured: SecuredCluster, tmp_path: Path, client_properties: None, operation: str, command: str
) -> None:
    """Every documented ACL but one: the instance stops before serving, with one line naming
    the missing one and the command that grants it. Create is only needed for topics to
    create: they are deleted first."""
    grant = command.format(bootstrap=secured.bootstrap)
    set_acls(
        secured,
        {binding(c.format(bootstrap=secured.bootstrap)) for _, c in DOCUMENTED} - {binding(grant)},
    )
    if operation == "Create":
        kafka_client.install(secured.client_properties(ADMIN))
        assert delete_topics_where(secured.bootstrap, lambda topic: topic.startswith(f"{SERVICE}."))
    error, log = _failed_start(secured.bootstrap, tmp_path, env=secured.environment(USER))
    assert f"error: the Kafka principal {PRINCIPAL} lacks an ACL the service needs: " in error
    assert error.endswith(f": {grant}"), error
    assert PASSWORD not in log


def test_a_store_over_another_producers_topic_needs_read_on_it(
    secured: SecuredCluster, client_properties: None
) -> None:
    """The documented ACLs and Read on the topic a ``LatestValue`` store reads: without the
    latter, the start stops naming it (checked where an instance checks it, without starting
    one)."""
    kafka_client.install(secured.client_properties(ADMIN))
    ensure_topics(secured.bootstrap, [TopicSpec("prices", 2)])
    documented = {binding(c.format(bootstrap=secured.bootstrap)) for _, c in DOCUMENTED}
    set_acls(secured, documented)
    kafka_client.install(secured.client_properties(USER))
    settings = Settings(service=SERVICE, bootstrap_servers=secured.bootstrap, partitions=2)
    projections = [LatestValue("price", topic="prices")]
    with pytest.raises(MissingAcl) as refused:
        provision(settings, projections)
    grant = (
        f"kafka-acls.sh --bootstrap-server {secured.bootstrap} --command-config admin.properties "
        f"--add --allow-principal {PRINCIPAL} --operation Read --topic prices"
    )
    assert str(refused.value).endswith(f": {grant}"), refused.value
    set_acls(secured, documented | {binding(grant)})
    assert provision(settings, projections) == {f"{SERVICE}.events": 2, "prices": 2}


def test_a_wrong_password_stops_an_instance_at_start_naming_the_setting(
    secured: SecuredCluster, tmp_path: Path
) -> None:
    """The shared settings in a properties file, the password in a variable (as the docs
    suggest): the line names both settings a SCRAM login rests on, and where each came from."""
    wrong = "not-" + PASSWORD
    config = tmp_path / "client.properties"
    properties = secured.client_properties(USER)
    del properties["sasl.password"]
    config.write_text("".join(f"{name}={value}\n" for name, value in properties.items()))
    error, log = _failed_start(
        secured.bootstrap,
        tmp_path,
        env={"KAFKA_SASL_PASSWORD": wrong},
        args=["--kafka-config", str(config)],
    )
    assert f"error: Kafka at {secured.bootstrap} refused the client's authentication" in error
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in error
    assert "check sasl.password (from KAFKA_SASL_PASSWORD), sasl.username (from " in error
    assert f"sasl.username (from {config}:3)" in error
    assert wrong not in log


def test_an_instance_that_does_not_trust_the_certificate_stops_at_once(
    secured: SecuredCluster, tmp_path: Path
) -> None:
    environment = secured.environment(USER)
    del environment["KAFKA_SSL_CA_LOCATION"]  # the system's CAs, which never signed it
    error, _ = _failed_start(secured.bootstrap, tmp_path, env=environment)
    assert f"error: Kafka at {secured.bootstrap} failed the TLS handshake" in error
    assert "certificate verify failed" in error
    assert "check ssl.ca.location (not set)" in error


def test_no_create_topics_names_the_missing_topics_and_how_to_create_them(
    fresh_broker: KafkaCluster, tmp_path: Path
) -> None:
    _, log = _failed_start(
        fresh_broker.bootstrap,
        tmp_path,
        args=["--no-create-topics", "--replication-factor", "1", "--min-insync-replicas", "1"],
    )
    found = re.search(
        r"error: (\d+) topic\(s\) the service needs do not exist and topic creation is off "
        r"\(--no-create-topics\): (.+?)\. Create them",
        log,
    )
    assert found, log
    named = found.group(2).strip().split(", ")
    assert int(found.group(1)) == len(named)
    assert {"inventory.events", "inventory.cluster", "inventory.stock.changelog"} <= set(named)
    commands = re.findall(r"^  kafka-topics\.sh .*$", log, re.MULTILINE)
    assert len(commands) == len(named), log
    # Created as the error says, the topics are what the service needs: its events, the
    # compacted cluster map and changelogs, and the dead-letter topics.
    specs = [_spec_of(command) for command in commands]
    assert sorted(s.name for s in specs) == sorted(named)
    for spec in specs:
        assert spec.compact == spec.name.endswith((".cluster", ".changelog")), spec
    ensure_topics(fresh_broker.bootstrap, specs)
    settings = Settings(
        service="inventory", bootstrap_servers=fresh_broker.bootstrap, partitions=2
    ).with_(create_topics=False)
    assert provision(settings, inventory.projections) == {"inventory.events": 2}


def _spec_of(command: str) -> TopicSpec:
    words = command.split()
    configs = dict(words[n + 1].split("=", 1) for n, word in enumerate(words) if word == "--config")
    assert words[words.index("--replication-factor") + 1] == "1"
    assert configs.pop("min.insync.replicas") == "1"
    compact = configs.pop("cleanup.policy", None) == "compact"
    assert not configs, command
    return TopicSpec(
        words[words.index("--topic") + 1],
        int(words[words.index("--partitions") + 1]),
        compact=compact,
    )


def test_a_replication_factor_the_cluster_cannot_hold_is_refused_with_the_remedy(
    broker: KafkaCluster,
) -> None:
    """The session's broker is one node: Kafka refuses two replicas, which shows the factor
    asked is the one sent."""
    settings = Settings(
        service="replicated", bootstrap_servers=broker.bootstrap, partitions=2, replication_factor=2
    )
    with pytest.raises(ConfigurationError, match="use a --replication-factor no larger than"):
        provision(settings, inventory.projections)


def test_topics_are_created_with_the_min_insync_replicas_asked(broker: KafkaCluster) -> None:
    settings = Settings(
        service="insync", bootstrap_servers=broker.bootstrap, partitions=2, min_insync_replicas=2
    )
    provision(settings, inventory.projections)
    admin = kafka_client.admin_client(broker.bootstrap)
    topics = ["insync.events", "insync.cluster", "insync.stock.changelog"]
    resources = [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in topics]
    for resource, future in admin.describe_configs(resources).items():
        assert future.result(timeout=10)["min.insync.replicas"].value == "2", resource.name


def test_a_changelog_that_is_not_compacted_is_refused(broker: KafkaCluster) -> None:
    ensure_topics(
        broker.bootstrap,
        [TopicSpec("uncompacted.stock.changelog", 2, config={"cleanup.policy": "delete"})],
    )
    settings = Settings(service="uncompacted", bootstrap_servers=broker.bootstrap, partitions=2)
    with pytest.raises(ConfigurationError, match="cleanup.policy=delete, but changelogs must"):
        provision(settings, inventory.projections)
