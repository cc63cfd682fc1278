"""The options of ``foldstream serve``, one type each (typer reads them from the annotations).

Each option's environment variable and default are in
:class:`foldstream.settings.Settings`; the configuration reference lists them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from foldstream.serving import HttpServer
from foldstream.settings import OnStaleState

ServiceOption = Annotated[str, typer.Option(help="import path of the Service")]
PortOption = Annotated[int, typer.Option()]
HostOption = Annotated[str, typer.Option()]
BootstrapOption = Annotated[
    str | None, typer.Option(help="Kafka bootstrap servers (env: KAFKA_BOOTSTRAP_SERVERS)")
]
StateDirOption = Annotated[Path | None, typer.Option(help="where stores live")]
PartitionsOption = Annotated[int | None, typer.Option(help="events topic partitions")]
KafkaConfigOption = Annotated[
    Path | None,
    typer.Option(
        help="Kafka client properties file: security (SASL, TLS) and other librdkafka "
        "properties; KAFKA_<NAME> variables override it (env: FOLDSTREAM_KAFKA_CONFIG)"
    ),
]
ReplicationFactorOption = Annotated[
    int | None,
    typer.Option(
        help="replication factor of the topics created (default: the brokers'; env: "
        "FOLDSTREAM_REPLICATION_FACTOR)"
    ),
]
MinInsyncReplicasOption = Annotated[
    int | None,
    typer.Option(
        help="min.insync.replicas of the topics created (default: the brokers'; env: "
        "FOLDSTREAM_MIN_INSYNC_REPLICAS)"
    ),
]
CreateTopicsOption = Annotated[
    bool | None,
    typer.Option(
        "--create-topics/--no-create-topics",
        help="create missing topics, or fail at start naming them (locked-down clusters) "
        "(default: create; env: FOLDSTREAM_CREATE_TOPICS)",
    ),
]
SparkMasterOption = Annotated[str | None, typer.Option(help="e.g. local[*], spark://h:7077")]
AdvertisedUrlOption = Annotated[
    str | None, typer.Option(help="URL clients and other instances reach this one at")
]
StandbysOption = Annotated[
    int | None, typer.Option(help="warm standby copies of each partition (default 1)")
]
SessionTimeoutMsOption = Annotated[
    int | None, typer.Option(help="how long a silent instance keeps its partitions")
]
SuspectAfterMsOption = Annotated[
    int | None,
    typer.Option(
        help="how late a member's heartbeats may be before no instance redirects to it (1000)"
    ),
]
ServerOption = Annotated[
    HttpServer, typer.Option(help="HTTP server; granian: faster lookups, own worker process")
]
ReadyMaxLagOption = Annotated[
    int | None,
    typer.Option(help="GET /ready is 200 only within this many records of the source (1000)"),
]
AuthTokenFileOption = Annotated[
    Path | None,
    typer.Option(
        help="file holding the bearer token commands need [env: FOLDSTREAM_AUTH_TOKEN_FILE,"
        " or the token itself in FOLDSTREAM_AUTH_TOKEN]"
    ),
]
AuthQueriesOption = Annotated[
    bool | None,
    typer.Option(help="require the token for queries too [env: FOLDSTREAM_AUTH_QUERIES]"),
]
OnStaleStateOption = Annotated[
    OnStaleState | None,
    typer.Option(
        help="what to do with a local store copy whose topics were deleted and created "
        "again, or forgotten by a broker that keeps them in memory: rebuild it from the "
        "topics (the default) or refuse to start (env FOLDSTREAM_ON_STALE_STATE)"
    ),
]
