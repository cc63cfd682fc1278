"""Service settings: one immutable object, built from keywords (or, in the CLI, the environment)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path

from foldstream.errors import ConfigurationError
from foldstream.http_input import InputLimits

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
#: A member's URL as others redirect clients to it: http(s), no user info, whitespace or
#: control characters (it is written into ``Location`` headers).
_URL = re.compile(r"^https?://[^\s\x00-\x1f\x7f/?#@]+(/[^\s\x00-\x1f\x7f?#]*)?$")
MAX_URL_LENGTH = 2048
#: The store of the command side's aggregate snapshots (one more store of the events topic:
#: changelog ``<service>._aggregates.changelog``). Projections may not take the name.
AGGREGATE_STORE = "_aggregates"
#: How often a member publishes its heartbeat (:class:`foldstream.cluster.map.Heartbeat`).
HEARTBEAT_INTERVAL_MS = 500
#: The largest micro-batch cap per partition a setting may ask for.
MAX_BATCH_RECORDS = 100_000_000
#: The longest retention of commands' Idempotency-Keys, and the most keys a partition keeps.
MAX_RETENTION_S = 365 * 86_400
MAX_IDEMPOTENCY_KEYS = 10_000_000


def valid_url(url: str) -> bool:
    """Whether ``url`` may be a member's URL (see :data:`_URL`)."""
    return len(url) <= MAX_URL_LENGTH and _URL.fullmatch(url) is not None


class OnStaleState(StrEnum):
    """What an instance does with a local copy of a store partition that does not belong to
    the topics it reads (see :mod:`foldstream.state.validity`)."""

    #: Log why, discard the copy and rebuild it from the topics.
    rebuild = "rebuild"
    #: Refuse to start, naming the state directory and the fix.
    refuse = "refuse"


@dataclass(frozen=True)
class Settings:
    """Everything an instance needs to know about its environment.

    ``service`` prefixes every topic the service owns (``<service>.events``,
    ``<service>.<store>.changelog``, ``<service>.<store>.dlq``). ``bootstrap_servers`` may
    point at any Kafka cluster; ``kafka_config`` names a properties file of its clients'
    security and other settings (:mod:`~foldstream.kafka_client`). Topics are created with
    ``replication_factor`` and ``min_insync_replicas`` (None: the brokers' defaults), unless
    ``create_topics`` is false: then they must exist already.
    """

    service: str = "inventory"
    bootstrap_servers: str = "127.0.0.1:9092"
    state_dir: Path = field(default_factory=lambda: Path(".foldstream"))
    partitions: int = 6
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    create_topics: bool = True
    kafka_config: Path | None = None
    spark_master: str = "local[*]"
    host: str = "127.0.0.1"
    port: int = 8000
    advertised_url: str | None = None
    # Small fetch waits keep read models fresh: some brokers do not answer a waiting fetch early.
    fetch_wait_max_ms: int = 10
    # Consumers no request waits on (the cluster map, standby copies) poll less
    # often: an idle consumer costs the instance and the broker a fetch per wait.
    background_fetch_wait_max_ms: int = 100
    # A few ms of linger avoids partitions made of single-message batches, which slow brokers down.
    linger_ms: int = 5
    # Instances keeping a warm copy of each partition besides its active owner.
    standby_replicas: int = 1
    # How long a silent instance stays a member and keeps its partitions: bounds failover time.
    session_timeout_ms: int = 3000
    # How late a member's heartbeats may be before it is a suspect: still a member (it keeps
    # its partitions), but no instance redirects to it. Bounds how long clients are sent to a
    # dead member; at most the session timeout, above the heartbeat interval (500 ms).
    suspect_after_ms: int = 1000
    # /ready answers 200 only while every copy served is at most this many records behind its
    # source: not 0, which flaps under steady writes.
    ready_max_lag: int = 1000
    # Where the instance serves its open store partitions to the projection's Spark tasks:
    # loopback for a local master; an address the executors reach for a remote one.
    store_host: str = "127.0.0.1"
    # How large the parts of an HTTP request may be (URL, keys, names, bodies, JSON depth).
    limits: InputLimits = field(default_factory=InputLimits)
    # A bearer token clients must send for commands (and for queries with auth_queries): given
    # as it is, or in a file. Every member of a cluster needs the same one.
    auth_token: str | None = field(default=None, repr=False)
    auth_token_file: Path | None = None
    auth_queries: bool = False
    # Paths answered without credentials even when they are required.
    auth_open_paths: tuple[str, ...] = ("/health", "/ready", "/metrics")
    # A local copy whose topics were recreated under it (or that a broker which keeps its data
    # in memory forgot) is rebuilt from the topics, or the instance refuses to start.
    on_stale_state: OnStaleState = OnStaleState.rebuild
    # Aggregates the command side keeps in memory (the others are read from the aggregate
    # store when a command needs them), shared by the partitions the instance owns.
    aggregate_cache_size: int = 100_000
    # How long a query with a consistency token waits for a local copy to apply the token's
    # position before it answers 503 (Retry-After).
    consistency_wait_ms: int = 2000
    # Records of one partition a projection's micro-batch reads at most. Folded chunks commit
    # as they go (a retried task skips them), so the cap bounds planning, not memory or lost
    # work; fewer, larger micro-batches spend less on Spark's fixed cost of each.
    batch_records_per_partition: int = 500_000
    # How long an instance starting waits for the cluster to answer before it gives up with
    # an error (a broker started at the same moment may take a while).
    broker_wait_s: int = 30
    # How long (by the owners' clocks) and how many per partition commands sent with an
    # Idempotency-Key are remembered: a retry within both answers the first outcome. Every
    # instance of a service must use the same values (each owner expires by its own).
    idempotency_retention_s: int = 86_400
    idempotency_max_keys: int = 100_000

    def __post_init__(self) -> None:
        if not _NAME.match(self.service):
            raise ConfigurationError(
                f"service name {self.service!r} must be lowercase letters, digits, '-' or '_',"
                " starting with a letter"
            )
        if self.partitions < 1:
            raise ConfigurationError(f"partitions must be >= 1, got {self.partitions}")
        if self.standby_replicas < 0:
            raise ConfigurationError(f"standby_replicas must be >= 0, got {self.standby_replicas}")
        if self.session_timeout_ms < 1000:
            raise ConfigurationError(
                f"session_timeout_ms must be >= 1000, got {self.session_timeout_ms}"
            )
        if not HEARTBEAT_INTERVAL_MS < self.suspect_after_ms <= self.session_timeout_ms:
            raise ConfigurationError(
                f"suspect_after_ms must be above the heartbeat interval ({HEARTBEAT_INTERVAL_MS})"
                f" and at most session_timeout_ms ({self.session_timeout_ms}), got "
                f"{self.suspect_after_ms}"
            )
        if self.ready_max_lag < 0:
            raise ConfigurationError(f"ready_max_lag must be >= 0, got {self.ready_max_lag}")
        if self.aggregate_cache_size < 1:
            raise ConfigurationError(
                f"aggregate_cache_size must be >= 1, got {self.aggregate_cache_size}"
            )
        if not 0 <= self.consistency_wait_ms <= 60_000:
            raise ConfigurationError(
                f"consistency_wait_ms must be 0..60000, got {self.consistency_wait_ms}"
            )
        if not 1 <= self.batch_records_per_partition <= MAX_BATCH_RECORDS:
            raise ConfigurationError(
                f"batch_records_per_partition must be 1..{MAX_BATCH_RECORDS}, got "
                f"{self.batch_records_per_partition}"
            )
        if not 1 <= self.broker_wait_s <= 3600:
            raise ConfigurationError(f"broker_wait_s must be 1..3600, got {self.broker_wait_s}")
        self._check_idempotency()
        if not 0 < self.port < 65536:
            raise ConfigurationError(f"port must be 1..65535, got {self.port}")
        if not valid_url(self.url):
            raise ConfigurationError(
                f"advertised URL {self.url!r} must be http:// or https:// with a host, and no "
                "user info, whitespace or control characters"
            )
        self._check_replication()
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        if self.kafka_config is not None:
            object.__setattr__(self, "kafka_config", Path(self.kafka_config))
        # Settings handed over as JSON (to granian's worker) come back as plain values.
        if isinstance(self.limits, dict):
            object.__setattr__(self, "limits", InputLimits(**self.limits))
        if self.auth_token_file is not None:
            object.__setattr__(self, "auth_token_file", Path(self.auth_token_file))
        object.__setattr__(self, "auth_open_paths", tuple(self.auth_open_paths))

    def _check_idempotency(self) -> None:
        if not 1 <= self.idempotency_retention_s <= MAX_RETENTION_S:
            raise ConfigurationError(
                f"idempotency_retention_s must be 1..{MAX_RETENTION_S} (a year), got "
                f"{self.idempotency_retention_s}"
            )
        if not 1 <= self.idempotency_max_keys <= MAX_IDEMPOTENCY_KEYS:
            raise ConfigurationError(
                f"idempotency_max_keys must be 1..{MAX_IDEMPOTENCY_KEYS}, got "
                f"{self.idempotency_max_keys}"
            )

    def _check_replication(self) -> None:
        replication, min_insync = self.replication_factor, self.min_insync_replicas
        if replication is not None and replication < 1:
            raise ConfigurationError(f"replication_factor must be >= 1, got {replication}")
        if min_insync is not None and min_insync < 1:
            raise ConfigurationError(f"min_insync_replicas must be >= 1, got {min_insync}")
        if replication is not None and min_insync is not None and min_insync > replication:
            raise ConfigurationError(
                f"min_insync_replicas ({min_insync}) must not exceed replication_factor "
                f"({replication}): no write with acks=all could succeed"
            )
        try:
            object.__setattr__(self, "on_stale_state", OnStaleState(self.on_stale_state))
        except ValueError:
            raise ConfigurationError(
                f"on_stale_state must be one of {[p.value for p in OnStaleState]}, got "
                f"{self.on_stale_state!r}"
            ) from None

    @property
    def events_topic(self) -> str:
        return f"{self.service}.events"

    @property
    def cluster_topic(self) -> str:
        """The compacted topic where instances publish the cluster map and assignment."""
        return f"{self.service}.cluster"

    def changelog_topic(self, store: str) -> str:
        return f"{self.service}.{store}.changelog"

    def dead_letter_topic(self, store: str) -> str:
        """Where ``store``'s projection sends the records it cannot fold (``on_error``
        ``dead-letter``): one partition per partition of its source topic."""
        return f"{self.service}.{store}.dlq"

    @property
    def url(self) -> str:
        """The base URL other instances and clients use to reach this one."""
        return self.advertised_url or f"http://{self.host}:{self.port}"

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from ``FOLDSTREAM_*`` / ``KAFKA_BOOTSTRAP_SERVERS``; keywords win. The
        bootstrap servers come from the keyword, else ``KAFKA_BOOTSTRAP_SERVERS``, else the
        ``bootstrap.servers`` of the client properties file (``kafka_config``)."""
        env = os.environ
        values: dict[str, object] = {}
        if "KAFKA_BOOTSTRAP_SERVERS" in env:
            values["bootstrap_servers"] = env["KAFKA_BOOTSTRAP_SERVERS"]
        for name, kind in (
            ("service", str),
            ("state_dir", Path),
            ("partitions", int),
            ("replication_factor", int),
            ("min_insync_replicas", int),
            ("create_topics", _flag),
            ("kafka_config", Path),
            ("spark_master", str),
            ("advertised_url", str),
            ("standby_replicas", int),
            ("session_timeout_ms", int),
            ("suspect_after_ms", int),
            ("store_host", str),
            ("ready_max_lag", int),
            ("auth_token", str),
            ("auth_token_file", Path),
            ("auth_queries", _flag),
            ("on_stale_state", OnStaleState),
            ("aggregate_cache_size", int),
            ("consistency_wait_ms", int),
            ("batch_records_per_partition", int),
            ("broker_wait_s", int),
            ("idempotency_retention_s", int),
            ("idempotency_max_keys", int),
        ):
            raw = env.get(f"FOLDSTREAM_{name.upper()}")
            if raw is not None:
                try:
                    values[name] = kind(raw)
                except ValueError as exc:
                    raise ConfigurationError(f"FOLDSTREAM_{name.upper()}={raw!r}: {exc}") from exc
        if "FOLDSTREAM_AUTH_OPEN_PATHS" in env:
            paths = env["FOLDSTREAM_AUTH_OPEN_PATHS"].split(",")
            values["auth_open_paths"] = tuple(p.strip() for p in paths if p.strip())
        limits = _limits_from_env(env)
        if limits:
            values["limits"] = InputLimits(**limits)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "bootstrap_servers" not in values and values.get("kafka_config") is not None:
            from foldstream.kafka_properties import read_properties_file

            for name, value, _ in read_properties_file(Path(str(values["kafka_config"]))):
                if name == "bootstrap.servers":
                    values["bootstrap_servers"] = value
        return cls(**values)  # type: ignore[arg-type]


def _flag(raw: str) -> bool:
    """A boolean environment variable: true/false, yes/no, on/off or 1/0."""
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("not a boolean: use true or false")


def _limits_from_env(env: os._Environ[str]) -> dict[str, int]:
    """``FOLDSTREAM_MAX_URL_BYTES`` and the other :class:`InputLimits` fields, upper-cased."""
    limits = {}
    for limit in fields(InputLimits):
        raw = env.get(f"FOLDSTREAM_{limit.name.upper()}")
        if raw is not None:
            try:
                limits[limit.name] = int(raw)
            except ValueError as exc:
                raise ConfigurationError(f"FOLDSTREAM_{limit.name.upper()}={raw!r}: {exc}") from exc
    return limits
