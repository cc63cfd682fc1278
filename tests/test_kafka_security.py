"""Instances on a secured cluster, and topics for production, on a real broker.

TLS: the embedded broker (Tansu 0.6.0) cannot serve TLS itself, so it runs behind a TLS
terminator that relays bytes (:mod:`tests.secured_kafka` says why): every client of the
instance, its Spark tasks' included, has to speak TLS and trust the test's CA to reach it.

SASL: no SASL login can succeed on the Tansu 0.6.0 that foldstream embeds, so only the
failures are tested here. With ``--authentication`` Tansu offers SCRAM-SHA-256/512 and
OAUTHBEARER, not PLAIN (librdkafka: "SASL PLAIN mechanism handshake failed: ... broker's
supported mechanisms: (n/a)"; Tansu logs ``NoSharedMechanism``: its rsasl is built without
PLAIN). SCRAM credentials live in the storage engine, and this build has only the memory one
(dynostore), whose ``upsert_user_scram_credential`` does nothing and whose
``user_scram_credential`` finds no one: every SCRAM login fails with "broker responded with
unknown-user", and ``tansu user create`` against a broker that requires authentication is
itself refused ("early eof": an unauthenticated AlterUserScramCredentials). OAUTHBEARER fails
too: Tansu's callback accepts only PLAIN and SCRAM ("SASL Authentication failed"). So SCRAM
over TLS stands for wrong credentials below.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource

from foldstream import kafka_client
from foldstream.broker import KafkaCluster
from foldstream.errors import ConfigurationError
from foldstream.examples.inventory import service as inventory
from foldstream.kafka import TopicSpec, ensure_topics, read_to_end
from foldstream.process import InstanceProcess, http
from foldstream.settings import Settings
from foldstream.testing.steps import wait_until
from foldstream.topics import provision
from tests.secured_kafka import TlsCluster, tls_cluster

SECRET = "hunter2-s3cret"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    with tls_cluster(tmp_path_factory.mktemp("tls")) as cluster:
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


def test_an_instance_works_through_tls_with_a_properties_file(
    tls: TlsCluster, tmp_path: Path, client_properties: None
) -> None:
    """The file gives TLS; a variable adds a secret, which no log line shows. A command's
    value visible through a lookup went through the command writer, the Spark task's consumer
    and changelog producer, and the tailing consumers: all over TLS."""
    config = tmp_path / "client.properties"
    config.write_text(f"security.protocol=SSL\nssl.ca.location={tls.ca}\n")
    instance = InstanceProcess(
        bootstrap=tls.bootstrap,
        state_dir=tmp_path / "state",
        partitions=2,
        env={"KAFKA_SSL_KEY_PASSWORD": SECRET},
        args=["--kafka-config", str(config)],
    )
    with instance:
        instance.wait_ready(timeout=600)  # generous: a JVM start on a shared, loaded machine
        status, body = http(
            "POST", f"{instance.url}/commands/product/sku-tls/receive_shipment", {"quantity": 5}
        )
        assert status == 200, body
        wait_until(
            lambda: (
                http("GET", f"{instance.url}/stores/stock/keys/sku-tls")[1].get("value")
                == {"on_hand": 5}
            ),
            lambda: f"lookup: {http('GET', f'{instance.url}/stores/stock/keys/sku-tls')}",
        )
    log = instance.log_path.read_text()
    assert SECRET not in log
    assert "ssl.key.password=***" in log
    # The test's own helpers reach the cluster with the same client properties.
    kafka_client.install({"security.protocol": "SSL", "ssl.ca.location": str(tls.ca)})
    keys = [m.key() for batch in read_to_end(tls.bootstrap, "inventory.events", 2) for m in batch]
    assert set(keys) == {b"sku-tls"}


def test_an_instance_that_does_not_trust_the_certificate_stops_at_once(
    tls: TlsCluster, tmp_path: Path
) -> None:
    error, _ = _failed_start(
        tls.bootstrap,
        tmp_path,
        env={"KAFKA_SECURITY_PROTOCOL": "SSL"},  # no ssl.ca.location: the system's CAs
    )
    assert f"error: Kafka at {tls.bootstrap} failed the TLS handshake" in error
    assert "certificate verify failed" in error


def test_rejected_credentials_stop_an_instance_at_once(tmp_path: Path) -> None:
    with tls_cluster(tmp_path / "sasl", authentication=True) as cluster:
        error, log = _failed_start(
            cluster.bootstrap,
            tmp_path,
            env={
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SSL_CA_LOCATION": str(cluster.ca),
                "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "KAFKA_SASL_USERNAME": "alice",
                "KAFKA_SASL_PASSWORD": SECRET,
            },
        )
    assert f"error: Kafka at {cluster.bootstrap} refused the client's authentication" in error
    assert "SCRAM authentication failed" in error
    assert SECRET not in log


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


def test_topics_are_created_with_the_replication_and_min_insync_asked(
    broker: KafkaCluster,
) -> None:
    """Tansu keeps one copy whatever is asked, but reports the replicas it was asked for."""
    settings = Settings(
        service="replicated",
        bootstrap_servers=broker.bootstrap,
        partitions=2,
        replication_factor=2,
        min_insync_replicas=2,
    )
    provision(settings, inventory.projections)
    admin = kafka_client.admin_client(broker.bootstrap)
    topics = ["replicated.events", "replicated.cluster", "replicated.stock.changelog"]
    metadata = admin.list_topics(timeout=10).topics
    for topic in topics:
        assert all(len(p.replicas) == 2 for p in metadata[topic].partitions.values()), topic
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
