"""The Kafka client configuration: where properties come from (``KAFKA_*``, a properties file),
which wins, what is refused, that secrets never show, and that every client and Spark task
gets the same properties."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from foldstream import kafka_client
from foldstream.errors import ConfigurationError
from foldstream.kafka import consumer_config, producer_config
from foldstream.kafka_properties import (
    MANAGED,
    env_properties,
    from_jaas,
    load_client_properties,
    parse_properties,
    redact_text,
    redacted,
)
from foldstream.settings import Settings

SECRET = "hunter2-s3cret"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def test_variables_name_librdkafka_properties() -> None:
    environ = {
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISMS": "SCRAM-SHA-512",  # librdkafka's other name
        "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "svc",
        "KAFKA_BOOTSTRAP_SERVERS": "b:9092",  # a setting of its own
        "KAFKA_CLIENT_ID": "",  # empty: unset
        "KAFKA_HOME": "/opt/kafka",  # Kafka's scripts'
        "KAFKA_PORT": "tcp://10.0.0.1:9092",  # Kubernetes' service links
        "KAFKA_SERVICE_HOST": "10.0.0.1",
        "PATH": "/bin",
    }
    assert {(name, value) for name, value, _ in env_properties(environ)} == {
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.oauthbearer.client.id", "svc"),
    }


def test_properties_files_are_read_as_java_reads_them() -> None:
    text = (
        "# a comment\n"
        "! another\n"
        "security.protocol=SASL_SSL\n"
        "  sasl.mechanism : SCRAM-SHA-256\n"
        "client.id svc\n"
        "sasl.username=a\\\n"
        "    lice\n"
        "sasl.password=p\\=w\\u0021 \n"
        "\n"
        "empty=\n"
    )
    assert [(key, value) for _, key, value in parse_properties(text)] == [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-256"),
        ("client.id", "svc"),
        ("sasl.username", "alice"),
        ("sasl.password", "p=w! "),
        ("empty", ""),
    ]
    assert [line for line, _, _ in parse_properties(text)] == [3, 4, 5, 6, 8, 10]


def test_java_jaas_logins_become_librdkafka_properties() -> None:
    scram = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="a \\"quoted\\" secret";'
    )
    assert from_jaas(scram, "f:1") == {
        "sasl.username": "alice",
        "sasl.password": 'a "quoted" secret',
    }
    oauth = (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'clientId="svc" clientSecret="s" scope="kafka";'
    )
    assert from_jaas(oauth, "f:1") == {
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "svc",
        "sasl.oauthbearer.client.secret": "s",
        "sasl.oauthbearer.scope": "kafka",
    }
    with pytest.raises(ConfigurationError, match="f:1: .*Krb5LoginModule"):
        from_jaas("com.sun.security.auth.module.Krb5LoginModule required;", "f:1")


def test_variables_beat_the_file_and_each_property_says_where_it_came_from(
    tmp_path: Path,
) -> None:
    path = _file(
        tmp_path,
        "bootstrap.servers=file:9092\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="file-user" password="file-password";\n',
    )
    loaded = load_client_properties(path, {"KAFKA_SASL_USERNAME": "env-user"})
    assert loaded.bootstrap == "file:9092"
    assert loaded.properties == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "env-user",
        "sasl.password": "file-password",
    }
    assert loaded.origins["sasl.username"] == "KAFKA_SASL_USERNAME"
    assert loaded.origins["sasl.password"] == f"{path}:4"
    assert "file-password" not in loaded.describe() and "file-password" not in repr(loaded)
    assert "sasl.password=***" in loaded.describe()


@pytest.mark.parametrize(
    ("environ", "error"),
    [
        ({"KAFKA_SASL_MECHANISIM": "PLAIN"}, r'"sasl.mechanisim" \(from KAFKA_SASL_MECHANISIM\)'),
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, r'Invalid value "TLS" .*KAFKA_SECURITY_PROTOCOL'),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256"},
            "sasl.username and sasl.password must be set",
        ),
        ({"KAFKA_SSL_CA_LOCATION": "/no/such/ca.pem"}, "no such file /no/such/ca.pem"),
        ({"KAFKA_ACKS": "1"}, "KAFKA_ACKS sets acks, which foldstream sets itself"),
        ({"KAFKA_REQUEST_REQUIRED_ACKS": "1"}, "sets acks, which foldstream sets itself"),
        ({"KAFKA_GROUP_ID": "mine"}, "sets group.id, which foldstream sets itself"),
        ({"KAFKA_SSL_TRUSTSTORE_LOCATION": "/x.jks"}, "KAFKA_SSL_TRUSTSTORE_LOCATION.*PEM"),
    ],
)
def test_bad_properties_are_one_clear_error(environ: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        load_client_properties(None, environ)


def test_a_java_only_property_gets_its_remedy(tmp_path: Path) -> None:
    path = _file(tmp_path, "sasl.login.callback.handler.class=com.example.Login\n")
    with pytest.raises(ConfigurationError, match=rf"{path}:1\): .*sasl.oauthbearer.method=oidc"):
        load_client_properties(path, {})


def test_secrets_never_show() -> None:
    properties = {
        "sasl.password": SECRET,
        "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.config": SECRET,
        "ssl.key.password": SECRET,
        "ssl.key.pem": SECRET,
        "sasl.username": "alice",
    }
    shown = redacted(properties)
    assert SECRET not in json.dumps(shown)
    assert shown["sasl.username"] == "alice"
    assert redact_text(f"bad value {SECRET} here", properties) == "bad value *** here"


def test_the_cli_says_one_error_line_without_the_secret(tmp_path: Path) -> None:
    """``foldstream serve`` with a bad property stops before connecting anywhere."""
    path = _file(tmp_path, f"sasl.password={SECRET}\nsecurity.protocl=SSL\n")
    finished = subprocess.run(
        [sys.executable, "-m", "foldstream", "serve", "--kafka-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"},
    )
    assert finished.returncode == 2, finished.stderr
    errors = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f'error: Kafka client configuration: No such configuration property: "security.protocl" '
        f"(from {path}:2)"
    ], finished.stderr
    assert "Traceback" not in finished.stderr
    assert SECRET not in finished.stdout + finished.stderr


def test_every_client_gets_the_installed_properties(client_properties: None) -> None:
    kafka_client.install({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"})
    for config in (
        producer_config("b:1"),
        consumer_config("b:1"),
        kafka_client.client_config("b:1"),
    ):
        assert config["bootstrap.servers"] == "b:1"
        assert config["security.protocol"] == "SASL_SSL"
        assert config["sasl.mechanism"] == "PLAIN"


def test_properties_the_config_functions_set_may_not_be_configured(client_properties: None) -> None:
    kafka_client.install({})
    set_by_foldstream = (set(producer_config("b:1")) | set(consumer_config("b:1"))) - {
        "bootstrap.servers"
    }
    assert set_by_foldstream <= set(MANAGED)


def test_spark_tasks_install_what_the_options_carry(client_properties: None) -> None:
    """The option's name is one Spark's default redaction pattern hides."""
    kafka_client.install({"security.protocol": "SSL", "ssl.key.password": SECRET})
    options = kafka_client.spark_options()
    assert re.search(r"(?i)secret|password|token|access[.]?key", kafka_client.SPARK_OPTION)
    kafka_client.install({})
    kafka_client.install_from_options({"bootstrap": "b:1"})  # carries none: unchanged
    assert kafka_client.installed() == {}
    kafka_client.install_from_options({"bootstrap": "b:1", **options})
    assert kafka_client.installed() == {"security.protocol": "SSL", "ssl.key.password": SECRET}


def test_settings_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(tmp_path, "bootstrap.servers=from-file:9092\n")
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("FOLDSTREAM_KAFKA_CONFIG", str(path))
    monkeypatch.setenv("FOLDSTREAM_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("FOLDSTREAM_MIN_INSYNC_REPLICAS", "2")
    monkeypatch.setenv("FOLDSTREAM_CREATE_TOPICS", "false")
    settings = Settings.from_env()
    assert settings.kafka_config == path
    assert settings.bootstrap_servers == "from-file:9092"
    assert (settings.replication_factor, settings.min_insync_replicas) == (3, 2)
    assert settings.create_topics is False
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "from-env:9092")
    assert Settings.from_env().bootstrap_servers == "from-env:9092"
    assert Settings.from_env(bootstrap_servers="flag:9092").bootstrap_servers == "flag:9092"
    assert Settings.from_env().replication_factor == 3
    assert Settings().replication_factor is None  # the brokers' default
    monkeypatch.setenv("FOLDSTREAM_CREATE_TOPICS", "maybe")
    with pytest.raises(ConfigurationError, match="FOLDSTREAM_CREATE_TOPICS"):
        Settings.from_env()


def test_min_insync_replicas_cannot_exceed_the_replication_factor() -> None:
    with pytest.raises(ConfigurationError, match="must not exceed replication_factor"):
        Settings(replication_factor=2, min_insync_replicas=3)
    with pytest.raises(ConfigurationError, match="replication_factor must be >= 1"):
        Settings(replication_factor=0)


def test_spark_shows_the_properties_option_redacted(client_properties: None) -> None:
    """The options of a projection's source, as Spark's plan shows them: the client properties
    redacted, plain options (the bootstrap) as they are."""
    from foldstream.spark import spark_session

    kafka_client.install({"security.protocol": "SASL_SSL", "sasl.password": SECRET})
    spark = spark_session("local[1]", "redaction")
    try:
        source = (
            spark.readStream.format("foldstream-fold")
            .option("bootstrap", "127.0.0.1:1")
            .option("topic", "t")
            .options(**kafka_client.spark_options())
            .load()
        )
        plan = source._jdf.queryExecution().toString()
    finally:
        spark.stop()
    assert "bootstrap=127.0.0.1:1" in plan
    assert f"{kafka_client.SPARK_OPTION}=*********(redacted)" in plan
    assert SECRET not in plan
