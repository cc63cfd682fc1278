"""Kafka client properties from ``KAFKA_*`` environment variables and a Java-style properties
file: parsed, checked by librdkafka itself, and redacted wherever they are shown.

``KAFKA_<NAME>`` is the librdkafka property ``<name>`` in lower case with ``_`` read as ``.``
(``KAFKA_SASL_MECHANISM`` -> ``sasl.mechanism``). A variable beats the file; an empty value
leaves a property unset. ``KAFKA_BOOTSTRAP_SERVERS`` is the instance's bootstrap setting, as
is ``bootstrap.servers`` in the file (which yields to the variable and ``--bootstrap``).
Properties foldstream sets itself (:data:`MANAGED`) are refused, and so is anything librdkafka
does not accept, with one :class:`~foldstream.errors.ConfigurationError` naming where the
property came from.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from foldstream.errors import ConfigurationError

ENV_PREFIX = "KAFKA_"
BOOTSTRAP = "bootstrap.servers"

#: ``KAFKA_*`` variables that are not client properties: Kafka's own scripts', Kubernetes'
#: service links of a service named ``kafka``, broker images' settings. They are ignored.
FOREIGN_ENV = re.compile(
    r"KAFKA_(?:HOME|OPTS|HEAP_OPTS|JVM_PERFORMANCE_OPTS|JMX_OPTS|JMX_PORT|LOG4J_OPTS"
    r"|GC_LOG_OPTS|DEBUG|CLUSTER_ID|PORT(?:_\w*)?|SERVICE_HOST|SERVICE_PORT(?:_\w*)?|CFG_\w*)"
)

_WHY_PRODUCER = "the command side's exactly-once appends and key routing depend on it"
_WHY_CONSUMER = "consumers assign partitions and keep their own offsets"
_WHY_COMMITTED = (
    "stores, copies and replays read committed records only, never a fenced writer's aborted events"
)
_WHY_TUNED = "foldstream tunes it per client (freshness, memory, the changelog's ack timeout)"
#: Properties foldstream sets on its clients itself, and why: a client configuration may not
#: set them.
MANAGED: dict[str, str] = {
    "enable.idempotence": _WHY_PRODUCER,
    "acks": _WHY_PRODUCER,
    "partitioner": _WHY_PRODUCER,
    "transactional.id": _WHY_PRODUCER,
    "group.id": _WHY_CONSUMER,
    "enable.auto.commit": _WHY_CONSUMER,
    "enable.auto.offset.store": _WHY_CONSUMER,
    "auto.offset.reset": _WHY_CONSUMER,
    "enable.partition.eof": _WHY_CONSUMER,
    "isolation.level": _WHY_COMMITTED,
    "linger.ms": _WHY_TUNED,
    "fetch.wait.max.ms": _WHY_TUNED,
    "fetch.message.max.bytes": _WHY_TUNED,
    "queued.max.messages.kbytes": _WHY_TUNED,
    "queue.buffering.max.messages": _WHY_TUNED,
    "batch.num.messages": _WHY_TUNED,
    "message.timeout.ms": _WHY_TUNED,
}
#: librdkafka's other names of the same properties: read as the name on the right.
ALIASES = {
    "sasl.mechanisms": "sasl.mechanism",
    "metadata.broker.list": BOOTSTRAP,
    "request.required.acks": "acks",
    "queue.buffering.max.ms": "linger.ms",
}
#: Remedies for properties of Java clients that librdkafka lacks.
JAVA_ONLY = {
    "ssl.truststore.location": "librdkafka reads PEM: set ssl.ca.location to the CA's PEM file "
    "(keytool -exportcert -rfc exports it from a trust store)",
    "ssl.truststore.password": "librdkafka reads PEM: set ssl.ca.location instead",
    "ssl.truststore.type": "librdkafka reads PEM: set ssl.ca.location instead",
    "sasl.login.callback.handler.class": "librdkafka fetches OIDC tokens itself: set "
    "sasl.oauthbearer.method=oidc and sasl.oauthbearer.token.endpoint.url",
    "sasl.client.callback.handler.class": "not supported by librdkafka: remove it",
}

_SECRET = re.compile(
    r"password|secret|token|jaas|oauthbearer\.config|\.pem$|private|assertion|credential", re.I
)
REDACTED = "***"


def is_secret(name: str) -> bool:
    """Whether the value of property ``name`` must never be shown (logged, printed, raised)."""
    return _SECRET.search(name) is not None


def redacted(properties: Mapping[str, object]) -> dict[str, object]:
    """``properties`` with every secret value replaced by :data:`REDACTED`."""
    return {k: REDACTED if is_secret(k) else v for k, v in properties.items()}


def redact_text(text: str, properties: Mapping[str, object]) -> str:
    """``text`` (an error message) with every secret value of ``properties`` in it replaced."""
    for name, value in properties.items():
        if is_secret(name) and isinstance(value, str) and value:
            text = text.replace(value, REDACTED)
    return text


@dataclass(frozen=True)
class ClientProperties:
    """Validated client properties (``{name: value}``), where each came from (``origins``:
    a variable's name or ``file:line``), and the file's ``bootstrap.servers``, if any."""

    properties: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    bootstrap: str | None = None

    def describe(self) -> str:
        """The properties for a log line, secrets redacted."""
        if not self.properties:
            return "no client properties (plaintext, no authentication)"
        return ", ".join(f"{k}={v}" for k, v in sorted(redacted(self.properties).items()))

    def __repr__(self) -> str:
        return f"ClientProperties({self.describe()})"


def load_client_properties(
    config_file: Path | None, environ: Mapping[str, str]
) -> ClientProperties:
    """The properties of ``config_file`` (if any) overridden by ``KAFKA_*`` in ``environ``,
    validated; raises :class:`ConfigurationError` naming the first bad one."""
    properties: dict[str, str] = {}
    origins: dict[str, str] = {}
    if config_file is not None:
        for name, value, origin in read_properties_file(Path(config_file)):
            properties[name], origins[name] = value, origin
    for name, value, origin in env_properties(environ):
        properties[name], origins[name] = value, origin
    bootstrap = properties.pop(BOOTSTRAP, None)
    origins.pop(BOOTSTRAP, None)
    for name in properties:
        if name in MANAGED:
            raise ConfigurationError(
                f"{origins[name]} sets {name}, which foldstream sets itself ({MANAGED[name]}): "
                "remove it"
            )
        if name in JAVA_ONLY:
            raise ConfigurationError(f"{name} (from {origins[name]}): {JAVA_ONLY[name]}")
    checked = ClientProperties(properties, origins, bootstrap)
    validate(checked)
    return checked


def env_properties(environ: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """``(property, value, variable)`` of each ``KAFKA_*`` variable that is a client property,
    ``KAFKA_BOOTSTRAP_SERVERS`` excepted (a setting of its own)."""
    for variable in sorted(environ):
        value = environ[variable]
        if (
            not variable.startswith(ENV_PREFIX)
            or variable == "KAFKA_BOOTSTRAP_SERVERS"
            or FOREIGN_ENV.fullmatch(variable)
            or value == ""
        ):
            continue
        name = variable[len(ENV_PREFIX) :].lower().replace("_", ".")
        yield ALIASES.get(name, name), value, variable


def read_properties_file(path: Path) -> Iterator[tuple[str, str, str]]:
    """``(property, value, "file:line")`` of each entry of a Java-style properties file;
    ``sasl.jaas.config`` is translated into librdkafka's properties (:func:`from_jaas`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read the Kafka client config file {path}: {exc}") from exc
    for line_number, name, value in parse_properties(text):
        origin = f"{path}:{line_number}"
        if not name:
            raise ConfigurationError(f"{origin}: a line without a property name")
        if value == "":
            continue
        if name == "sasl.jaas.config":
            for translated, translated_value in from_jaas(value, origin).items():
                yield translated, translated_value, origin
            continue
        yield ALIASES.get(name, name), value, origin


def parse_properties(text: str) -> Iterator[tuple[int, str, str]]:
    """``(line number, key, value)`` of each entry of ``text`` in the format of Java's
    ``Properties.load``: ``#``/``!`` comments, ``=``, ``:`` or blanks between key and value,
    ``\\`` continuing a line, escapes (``\\t``, ``\\uXXXX``...)."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        first = index
        logical = lines[index].lstrip()
        index += 1
        if not logical or logical[0] in "#!":
            continue
        while _continues(logical) and index < len(lines):
            logical = logical[:-1] + lines[index].lstrip()
            index += 1
        if _continues(logical):
            logical = logical[:-1]
        key, value = _split_entry(logical)
        yield first + 1, _unescape(key), _unescape(value)


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


_SEPARATOR = re.compile(r"(?<!\\)(?:\\\\)*(?P<sep>[=:\s])")


def _split_entry(line: str) -> tuple[str, str]:
    match = _SEPARATOR.search(line)
    if match is None:
        return line, ""
    key, rest = line[: match.start("sep")], line[match.start("sep") :]
    rest = rest.lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)")


def _unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        escaped = match.group(1)
        if len(escaped) == 5:
            return chr(int(escaped[1:], 16))
        return _ESCAPES.get(escaped, escaped)

    return _ESCAPE.sub(one, text)


_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>\w+)(?P<options>.*?);?\s*$", re.S)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+))')


def from_jaas(jaas: str, origin: str) -> dict[str, str]:
    """librdkafka's properties for a Java client's ``sasl.jaas.config``: the username and
    password of PLAIN and SCRAM, the client credentials of OAUTHBEARER over OIDC."""
    matched = _JAAS.match(jaas)
    if matched is None:
        raise ConfigurationError(f"{origin}: sasl.jaas.config is not a JAAS login module entry")
    module = matched.group("module").rsplit(".", 1)[-1]
    options = {
        # Quoted values as Java's JAAS parser reads them: a backslash takes the next character.
        m.group(1): re.sub(r"\\(.)", r"\1", m.group(2)) if m.group(2) is not None else m.group(3)
        for m in _JAAS_OPTION.finditer(matched.group("options"))
    }
    if module in ("PlainLoginModule", "ScramLoginModule"):
        return {
            "sasl.username": options.get("username", ""),
            "sasl.password": options.get("password", ""),
        }
    if module == "OAuthBearerLoginModule" and "clientId" in options:
        oidc = {
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": options["clientId"],
            "sasl.oauthbearer.client.secret": options.get("clientSecret", ""),
        }
        if "scope" in options:
            oidc["sasl.oauthbearer.scope"] = options["scope"]
        return oidc
    raise ConfigurationError(
        f"{origin}: sasl.jaas.config uses {module}, which librdkafka cannot take from JAAS: "
        "set sasl.username/sasl.password (PLAIN, SCRAM) or sasl.oauthbearer.* (OAUTHBEARER)"
    )


_FILE_PROPERTIES = re.compile(r"ssl\.\w+\.location|ssl\.keystore\.location|sasl\.kerberos\.keytab")
_NAMED = re.compile(r'"([a-z0-9._]+)"|`([a-z0-9._]+)`')


def validate(checked: ClientProperties) -> None:
    """Raise :class:`ConfigurationError` unless librdkafka accepts ``checked``: each name, each
    value, their combination (a SASL mechanism's credentials...) and every file they name."""
    properties, origins = checked.properties, checked.origins
    for name, value in properties.items():
        if _FILE_PROPERTIES.fullmatch(name) and value != "probe" and not Path(value).exists():
            raise ConfigurationError(f"{name} (from {origins[name]}): no such file {value}")
    try:
        # Creating a client checks everything a client checks at start, connecting to nothing.
        Producer({**properties, "log_level": 0}).flush(0)
    except KafkaException as exc:
        message = redact_text(exc.args[0].str(), properties)
        # Not chained: librdkafka's own message may hold a secret value.
        raise ConfigurationError(
            f"Kafka client configuration: {_explained(message, origins)}"
        ) from None
    except (TypeError, ValueError) as exc:
        message = redact_text(str(exc), properties)
        raise ConfigurationError(f"Kafka client configuration: {message}") from None


def _explained(message: str, origins: Mapping[str, str]) -> str:
    """librdkafka's ``message`` with where the property it names came from."""
    for match in _NAMED.finditer(message):
        name = match.group(1) or match.group(2)
        if name in origins:
            return f"{message} (from {origins[name]})"
    return message
