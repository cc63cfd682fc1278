"""Service settings: one immutable object, built from keywords (or, in the CLI, the environment)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from foldstream.errors import ConfigurationError

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


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
    ``<service>.<store>.changelog``). ``bootstrap_servers`` may point at any Kafka cluster.
    """

    service: str = "inventory"
    bootstrap_servers: str = "127.0.0.1:9092"
    state_dir: Path = field(default_factory=lambda: Path(".foldstream"))
    partitions: int = 6
    replication_factor: int = 1
    spark_master: str = "local[*]"
    host: str = "127.0.0.1"
    port: int = 8000
    advertised_url: str | None = None
    # Small fetch waits keep read models fresh: some brokers do not answer a waiting fetch early.
    fetch_wait_max_ms: int = 10
    # Consumers no request waits on (the cluster map, standby copies, lag figures) poll less
    # often: an idle consumer costs the instance and the broker a fetch per wait.
    background_fetch_wait_max_ms: int = 100
    # A few ms of linger avoids partitions made of single-message batches, which slow brokers down.
    linger_ms: int = 5
    # Instances keeping a warm copy of each partition besides its active owner.
    standby_replicas: int = 1
    # How long a silent instance stays a member and keeps its partitions: bounds failover time.
    session_timeout_ms: int = 3000
    # Where the instance serves its open store partitions to the projection's Spark tasks:
    # loopback for a local master; an address the executors reach for a remote one.
    store_host: str = "127.0.0.1"
    # A local copy whose topics were recreated under it (or that a broker which keeps its data
    # in memory forgot) is rebuilt from the topics, or the instance refuses to start.
    on_stale_state: OnStaleState = OnStaleState.rebuild

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
        if not 0 < self.port < 65536:
            raise ConfigurationError(f"port must be 1..65535, got {self.port}")
        object.__setattr__(self, "state_dir", Path(self.state_dir))
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

    @property
    def url(self) -> str:
        """The base URL other instances and clients use to reach this one."""
        return self.advertised_url or f"http://{self.host}:{self.port}"

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from ``FOLDSTREAM_*`` / ``KAFKA_BOOTSTRAP_SERVERS``; keywords win."""
        env = os.environ
        values: dict[str, object] = {}
        if "KAFKA_BOOTSTRAP_SERVERS" in env:
            values["bootstrap_servers"] = env["KAFKA_BOOTSTRAP_SERVERS"]
        for name, kind in (
            ("service", str),
            ("state_dir", Path),
            ("partitions", int),
            ("spark_master", str),
            ("advertised_url", str),
            ("standby_replicas", int),
            ("session_timeout_ms", int),
            ("store_host", str),
            ("on_stale_state", OnStaleState),
        ):
            raw = env.get(f"FOLDSTREAM_{name.upper()}")
            if raw is not None:
                try:
                    values[name] = kind(raw)
                except ValueError as exc:
                    raise ConfigurationError(f"FOLDSTREAM_{name.upper()}={raw!r}: {exc}") from exc
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
