"""The one Kafka client configuration every client of a process gets: producers, consumers,
admin clients, and the Spark tasks of its projections.

A process installs its client properties once (:func:`configure`, at an instance's start; a
Spark task from its data source's options, :func:`install_from_options`); a process that never
does loads them from the environment on first use. :func:`client_config` (and so
:func:`~foldstream.kafka.producer_config` and :func:`~foldstream.kafka.consumer_config`) and
:func:`admin_client` merge them into every client's configuration.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from foldstream.errors import BrokerUnavailable, ConfigurationError
from foldstream.kafka_properties import ClientProperties, load_client_properties, redact_text

log = logging.getLogger(__name__)

#: The environment variable naming the client properties file (``serve --kafka-config``).
CONFIG_FILE_ENV = "FOLDSTREAM_KAFKA_CONFIG"
#: The data source option carrying the client properties to Spark tasks: its name matches
#: Spark's redaction pattern (``secret``), so Spark shows it redacted in plans, UI and logs.
SPARK_OPTION = "kafka_secret_properties"

_lock = threading.Lock()
_installed: dict[str, str] | None = None
_origins: dict[str, str] = {}


def configure(config_file: Path | None = None) -> ClientProperties:
    """Load, validate and install this process's client properties: ``config_file`` (else the
    one ``$FOLDSTREAM_KAFKA_CONFIG`` names) overridden by ``KAFKA_*``; logs them redacted."""
    loaded = load_client_properties(config_file or _env_config_file(), os.environ)
    with _lock:
        changed = _installed != loaded.properties
    install(loaded.properties, origins=loaded.origins)
    if changed:
        log.info("Kafka clients: %s", loaded.describe())
    return loaded


def _env_config_file() -> Path | None:
    named = os.environ.get(CONFIG_FILE_ENV)
    return Path(named) if named else None


def install(properties: Mapping[str, str], *, origins: Mapping[str, str] | None = None) -> None:
    """Make ``properties`` the client properties of every client this process creates next;
    ``origins`` says where each came from (a variable, ``file:line``), for error messages."""
    global _installed, _origins
    with _lock:
        _installed = dict(properties)
        _origins = dict(origins or {})


def installed() -> dict[str, str]:
    """This process's client properties (loaded from the environment if none were
    installed)."""
    global _installed, _origins
    with _lock:
        if _installed is None:
            loaded = load_client_properties(_env_config_file(), os.environ)
            _installed, _origins = loaded.properties, loaded.origins
        return dict(_installed)


def origin(name: str) -> str | None:
    """Where the installed property ``name`` came from, if it is set and that is known."""
    with _lock:
        return _origins.get(name)


def client_config(bootstrap: str, **extra: object) -> dict[str, object]:
    """A client's configuration: ``bootstrap``, this process's client properties, ``extra``."""
    return {"bootstrap.servers": bootstrap, **installed(), **extra}


def admin_client(bootstrap: str, **extra: object) -> AdminClient:
    """An admin client of the cluster at ``bootstrap`` with this process's client properties."""
    config: Any = client_config(bootstrap, **extra)  # callbacks (error_cb) are objects too
    return AdminClient(config)


def spark_options() -> dict[str, str]:
    """The data source options that carry this process's client properties to Spark tasks,
    which may run on other machines (see :func:`install_from_options`)."""
    return {SPARK_OPTION: json.dumps(installed())}


def install_from_options(options: Mapping[str, str]) -> None:
    """In a Spark task (or planning worker): install the client properties its data source
    options carry, if they carry any."""
    carried = options.get(SPARK_OPTION)
    if carried is not None:
        install(json.loads(carried))


#: Errors no retry mends: the client's credentials or TLS settings are wrong for the cluster.
_FATAL = {
    KafkaError._AUTHENTICATION: "refused the client's authentication",
    KafkaError._SSL: "failed the TLS handshake",
    KafkaError.SASL_AUTHENTICATION_FAILED: "refused the client's authentication",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "denied the client access",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "denied the client access",
}
_REMEDY = (
    "check the client properties (KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM, "
    "KAFKA_SASL_USERNAME/KAFKA_SASL_PASSWORD, KAFKA_SSL_CA_LOCATION or the --kafka-config file)"
)


#: The properties that make up a SASL mechanism's credentials.
_CREDENTIALS = {
    "PLAIN": ("sasl.password", "sasl.username"),
    "SCRAM-SHA-256": ("sasl.password", "sasl.username"),
    "SCRAM-SHA-512": ("sasl.password", "sasl.username"),
    "GSSAPI": ("sasl.kerberos.principal", "sasl.kerberos.keytab"),
}
_AUTHENTICATION = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}


def _remedy(code: int, properties: Mapping[str, str]) -> str:
    """Which settings to check for an error with ``code``, and where each came from."""
    if code in _AUTHENTICATION:
        mechanism = properties.get("sasl.mechanism", "GSSAPI").upper()
        names = _CREDENTIALS.get(mechanism) or tuple(
            sorted(n for n in properties if n.startswith("sasl.oauthbearer."))
        )
        return f"check {_settings([*names, 'sasl.mechanism'], properties)}"
    if code == KafkaError._SSL:
        ca = "ssl.ca.pem" if "ssl.ca.pem" in properties else "ssl.ca.location"
        return f"check {_settings([ca, 'security.protocol'], properties)}"
    return _REMEDY


def _settings(names: list[str], properties: Mapping[str, str]) -> str:
    """``names`` as ``name (from ORIGIN)``, or ``name (not set)``."""
    shown = []
    for name in names:
        where = origin(name)
        if name not in properties:
            shown.append(f"{name} (not set)")
        else:
            shown.append(f"{name} (from {where})" if where else name)
    return ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]


def wait_for_cluster(bootstrap: str, timeout: float = 30.0) -> None:
    """Return once the cluster at ``bootstrap`` answers this process's clients; raise one clear
    error at once when it rejects their credentials or TLS settings
    (:class:`ConfigurationError`), or after ``timeout`` when it does not answer
    (:class:`BrokerUnavailable`, with what librdkafka last said about the connection)."""
    errors: list[KafkaError] = []
    properties = installed()
    failures = _FailureLog()
    # librdkafka's connection failures go to the error below, not to stderr (unless the
    # properties ask for librdkafka's own logging).
    logging_asked = {"debug", "log_level"} & set(properties)
    admin = admin_client(
        bootstrap, error_cb=errors.append, **({} if logging_asked else {"logger": failures.logger})
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            errors.append(exc.args[0])
        admin.poll(0)  # serves error_cb and the logger
        fatal = next((e for e in errors if e.code() in _FATAL), None)
        if fatal is not None:
            reason = redact_text(fatal.str(), properties)
            raise ConfigurationError(
                f"Kafka at {bootstrap} {_FATAL[fatal.code()]}: {reason}; "
                f"{_remedy(fatal.code(), properties)}"
            )
        if time.monotonic() >= deadline:
            last = failures.last or (errors[-1].str() if errors else "no answer")
            raise BrokerUnavailable(
                f"no Kafka broker answered at {bootstrap} within {timeout:.0f}s "
                f"({redact_text(last, properties)}): check KAFKA_BOOTSTRAP_SERVERS; if the "
                f"cluster needs TLS or SASL, {_REMEDY}"
            )


class _FailureLog(logging.Handler):
    """Keeps the last connection failure librdkafka logs (its ``FAIL`` lines)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.last: str | None = None
        self.logger = logging.Logger("foldstream.kafka_client.probe")  # in no hierarchy
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("FAIL "):
            self.last = message.split("]: ", 1)[-1]
