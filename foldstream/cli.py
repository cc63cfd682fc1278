"""The ``foldstream`` command line: ``broker``, ``serve``, ``demo``, ``status``, ``versions``,
``rebuild`` and ``new``."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from foldstream.broker.node import DEFAULT_HEAP
from foldstream.errors import FoldstreamError
from foldstream.serve_options import (
    AdvertisedUrlOption,
    AuthQueriesOption,
    AuthTokenFileOption,
    BootstrapOption,
    CreateTopicsOption,
    HostOption,
    KafkaConfigOption,
    MinInsyncReplicasOption,
    OnStaleStateOption,
    PartitionsOption,
    PortOption,
    ReadyMaxLagOption,
    ReplicationFactorOption,
    ServerOption,
    ServiceOption,
    SessionTimeoutMsOption,
    SparkMasterOption,
    StandbysOption,
    StateDirOption,
    SuspectAfterMsOption,
)
from foldstream.serving import HttpServer

InstanceUrl = Annotated[
    str, typer.Argument(help="any instance of the cluster, e.g. http://127.0.0.1:8000")
]
DeclaredStore = Annotated[str, typer.Argument(help="the store, as declared")]

cli = typer.Typer(help="foldstream: event sourcing on Kafka with queryable PySpark read models.")
DEFAULT_SERVICE = "foldstream.examples.inventory:service"


def _show_version(asked: bool) -> None:
    if asked:
        from foldstream.api_docs import foldstream_version

        typer.echo(f"foldstream {foldstream_version()}")
        raise typer.Exit()


@cli.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    """foldstream: event sourcing on Kafka with queryable PySpark read models."""


BROKER_HELP = (
    "Run Apache Kafka (KRaft, every node both broker and controller) until Ctrl-C or SIGTERM, "
    "which stop every node cleanly. Its jars are fetched with Maven into ~/.cache/foldstream on "
    "first use (Java 17+ and Maven needed). Once every node answers it prints one line, "
    "KAFKA_BOOTSTRAP_SERVERS=host:port,..., on standard output."
)


@cli.command(help=BROKER_HELP)
def broker(
    port: Annotated[
        int,
        typer.Option(
            help="the first node's client port; nodes listen on the next ones, and their "
            "controllers on the ports after those"
        ),
    ] = 9092,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="where the nodes keep their logs: topics and records are kept across restarts "
            "(without it, a temporary directory removed when the broker stops: nothing is kept)"
        ),
    ] = None,
    brokers: Annotated[
        int, typer.Option(help="nodes, each a process of its own; the quorum is all of them")
    ] = 1,
    heap: Annotated[str, typer.Option(help="each node's Java heap (-Xmx)")] = DEFAULT_HEAP,
) -> None:
    """Run Apache Kafka (see :data:`BROKER_HELP`)."""
    from foldstream.broker import KafkaCluster

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = KafkaCluster(
        brokers=brokers,
        port=port,
        data_dir=data_dir,
        heap=heap,
        progress=lambda line: typer.echo(line, err=True),
    )
    with cluster:
        typer.echo(f"KAFKA_BOOTSTRAP_SERVERS={cluster.bootstrap}")
        kept = f"kept in {data_dir}" if data_dir else "nothing kept (no --data-dir)"
        typer.echo(f"Apache Kafka ready: {brokers} node(s), logs {kept}", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.is_set():
                stop.wait(0.5)
                cluster.check_running()  # a node that ended on its own ends the broker
        typer.echo("stopping Apache Kafka", err=True)
    typer.echo("Apache Kafka stopped", err=True)


@cli.command()
def serve(
    service: ServiceOption = DEFAULT_SERVICE,
    port: PortOption = 8000,
    host: HostOption = "127.0.0.1",
    bootstrap: BootstrapOption = None,
    state_dir: StateDirOption = None,
    partitions: PartitionsOption = None,
    kafka_config: KafkaConfigOption = None,
    replication_factor: ReplicationFactorOption = None,
    min_insync_replicas: MinInsyncReplicasOption = None,
    create_topics: CreateTopicsOption = None,
    spark_master: SparkMasterOption = None,
    advertised_url: AdvertisedUrlOption = None,
    standbys: StandbysOption = None,
    session_timeout_ms: SessionTimeoutMsOption = None,
    suspect_after_ms: SuspectAfterMsOption = None,
    server: ServerOption = HttpServer.uvicorn,
    ready_max_lag: ReadyMaxLagOption = None,
    auth_token_file: AuthTokenFileOption = None,
    auth_queries: AuthQueriesOption = None,
    on_stale_state: OnStaleStateOption = None,
) -> None:
    """Run one instance: commands, projections and queries on one HTTP port."""
    from foldstream.process import exit_with_parent
    from foldstream.service import load_service
    from foldstream.serving import configure_logging
    from foldstream.serving import serve as serve_instance
    from foldstream.settings import Settings

    configure_logging()
    exit_with_parent()
    definition = load_service(service)
    settings = Settings.from_env(
        service=definition.name,
        host=host,
        port=port,
        bootstrap_servers=bootstrap,
        state_dir=state_dir,
        partitions=partitions,
        kafka_config=kafka_config,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
        create_topics=create_topics,
        spark_master=spark_master,
        advertised_url=advertised_url,
        standby_replicas=standbys,
        session_timeout_ms=session_timeout_ms,
        suspect_after_ms=suspect_after_ms,
        ready_max_lag=ready_max_lag,
        auth_token_file=auth_token_file,
        auth_queries=auth_queries,
        on_stale_state=on_stale_state,
    )
    serve_instance(service, settings, server)


@cli.command()
def demo(
    service: Annotated[str, typer.Option(help="import path of the Service")] = DEFAULT_SERVICE,
    commands: Annotated[int, typer.Option(help="how many commands to send")] = 300,
    partitions: Annotated[int, typer.Option()] = 6,
    instances: Annotated[
        int, typer.Option(help="instances to run; with 2 or more the demo shows routing")
    ] = 3,
) -> None:
    """Start a broker and a cluster, send random commands; print queried vs folded values, then
    show a redirect, a standby read and a kill -9 failover."""
    from foldstream.demo import run_demo

    if instances < 1:
        raise typer.BadParameter("at least 1", param_hint="--instances")
    raise typer.Exit(
        run_demo(
            service=service, commands=commands, partitions=partitions, instances_count=instances
        )
    )


@cli.command()
def status(
    url: InstanceUrl,
    token: Annotated[
        str | None,
        typer.Option(help="bearer token, when queries need one", envvar="FOLDSTREAM_AUTH_TOKEN"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to keep trying")] = 10.0,
) -> None:
    """Print the cluster: its members and their readiness, and who serves each partition."""
    from foldstream.status import print_status

    raise typer.Exit(print_status(url, token=token, timeout=timeout))


@cli.command()
def versions(
    url: InstanceUrl,
    store: DeclaredStore,
    token: Annotated[
        str | None,
        typer.Option(help="bearer token, when queries need one", envvar="FOLDSTREAM_AUTH_TOKEN"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to follow a build")] = 3600.0,
) -> None:
    """Print a store's versions; while a new one is built, show its progress until it answers
    (exit 0; 1 on timeout). See docs/concepts/versions.md."""
    from foldstream.version_watch import watch_versions

    raise typer.Exit(watch_versions(url, store, token=token, timeout=timeout))


@cli.command()
def rebuild(
    url: InstanceUrl,
    store: DeclaredStore,
    token: Annotated[
        str | None,
        typer.Option(help="bearer token, as for commands", envvar="FOLDSTREAM_AUTH_TOKEN"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to follow the rebuild")] = 3600.0,
) -> None:
    """Rebuild the version of a store that answers, beside it, and show its progress until the
    new generation answers (exit 0; 1 on timeout). See docs/concepts/versions.md."""
    from foldstream.version_watch import rebuild as run_rebuild

    raise typer.Exit(run_rebuild(url, store, token=token, timeout=timeout))


@cli.command()
def new(
    name: Annotated[str, typer.Argument(help="the service's name, e.g. 'Warehouse Ledger'")],
    output_dir: Annotated[Path, typer.Option(help="where the service's directory goes")] = Path(
        "."
    ),
    foldstream_url: Annotated[
        str | None,
        typer.Option(
            help="where pip gets foldstream: a file:// checkout or wheel, a git+https:// URL, or "
            "'' for the package index [default: where this foldstream was installed from]"
        ),
    ] = None,
    template: Annotated[
        str | None,
        typer.Option(help="template path or git URL [default: the one shipped in the package]"),
    ] = None,
) -> None:
    """Create a service from the template (cookiecutter), ready for `make demo` / `make test`."""
    from foldstream.template import new_service

    created = new_service(
        name, output_dir=output_dir, foldstream_url=foldstream_url, template=template
    )
    typer.echo(f"created {created}\nnext: cd {created} && make test && make serve (see README.md)")


def main() -> None:
    try:
        cli()
    except FoldstreamError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc
