"""Serving an instance over HTTP: on uvicorn (the default) or on granian.

granian parses HTTP in Rust threads outside the GIL, which leaves more of the Python process to
the lookups themselves (measured by ``make bench``: the lookup figure on both servers). It runs
the app in a worker process it spawns: the instance (its Spark session, Kafka clients and
stores) is built there, from the settings handed over in :data:`SERVE_ENV`.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from dataclasses import asdict
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from foldstream.errors import ConfigurationError
from foldstream.log_format import configure_logging, log_format
from foldstream.memory import limit_malloc_arenas
from foldstream.settings import Settings

if TYPE_CHECKING:  # the CLI imports this module; the query side loads only to serve
    from foldstream.query_api.fast_lookup import FastLookups

#: The environment variable carrying the instance's service and settings to granian's worker.
SERVE_ENV = "FOLDSTREAM_SERVE"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class HttpServer(StrEnum):
    """The HTTP servers an instance runs on."""

    uvicorn = "uvicorn"
    granian = "granian"


def serve(service_path: str, settings: Settings, server: HttpServer) -> None:
    """Run the instance of ``service_path`` with ``settings`` until it is stopped.

    Its topics are created and its local state checked first (:mod:`foldstream.preflight`):
    a :class:`~foldstream.errors.FoldstreamError` there (Kafka unreachable, a state directory
    refused) is raised before anything serves, for the CLI to print as one line.
    """
    limit_malloc_arenas()
    if server is HttpServer.granian:
        from foldstream.preflight import prepare
        from foldstream.service import load_service

        prepare(load_service(service_path), settings)
        _serve_granian(service_path, settings)
        return
    import uvicorn

    from foldstream.instance import Instance
    from foldstream.query_api.lookup_protocol import lookup_protocol
    from foldstream.service import load_service

    instance = Instance(
        service=load_service(service_path), service_path=service_path, settings=settings
    )
    instance.prepare()
    app = instance.app
    # Redirect locations come from members' advertised URLs, never from forwarded headers.
    uvicorn.run(
        app,
        http=lookup_protocol(app),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        # JSON logs: uvicorn's loggers go through the root handler instead of its own format.
        log_config=None if log_format() == "json" else uvicorn.config.LOGGING_CONFIG,
        lifespan="on",
        proxy_headers=False,
        server_header=False,
    )


def _instance_app(service_path: str, settings: Settings) -> FastLookups:
    from foldstream.instance import Instance
    from foldstream.service import load_service

    return Instance(
        service=load_service(service_path), service_path=service_path, settings=settings
    ).app


def _serve_granian(service_path: str, settings: Settings) -> None:
    try:
        from granian import Granian
        from granian.constants import Interfaces
        from granian.log import LogLevels
    except ImportError:
        raise ConfigurationError(
            "--server granian needs granian: pip install 'foldstream[granian]'"
        ) from None
    os.environ[SERVE_ENV] = json.dumps(
        {"service": service_path, "settings": asdict(settings)}, default=str
    )
    Granian(
        "foldstream.serving:granian_app",
        address=settings.host,
        port=settings.port,
        interface=Interfaces.ASGI,
        factory=True,
        workers=1,  # one instance per process: it owns its partitions and its Spark session
        log_level=LogLevels.warning,
    ).serve()


def granian_app() -> Any:
    """The instance's app, built in granian's worker from :data:`SERVE_ENV` (a factory)."""
    _die_with_parent()
    configure_logging()
    handed = json.loads(os.environ[SERVE_ENV])
    return _instance_app(handed["service"], Settings(**handed["settings"]))


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this worker when granian's process dies, even by ``kill -9``:
    a killed instance is then gone whole, as on uvicorn, instead of an orphan serving on and
    holding its partitions (seen without this). Linux only (``prctl``)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        logging.getLogger(__name__).warning(
            "prctl(PR_SET_PDEATHSIG) failed: %s", ctypes.get_errno()
        )
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
