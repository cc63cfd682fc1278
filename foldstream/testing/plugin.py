"""The foldstream pytest plugin: one real broker per session and real instances per module.

Load it from the project's root ``conftest.py`` and name the service under test::

    pytest_plugins = ["foldstream.testing.plugin"]

    @pytest.fixture(scope="session")
    def foldstream_service() -> str:
        return "my_service.query_api:service"

It loads the step library (:mod:`foldstream.testing.steps`) as well, so feature files can use
its sentences with nothing but ``scenarios(...)`` in a test module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from foldstream.broker import EmbeddedBroker
from foldstream.process import InstanceProcess

pytest_plugins = ["foldstream.testing.steps"]


class InstancePool:
    """Instances started on first use, one per service path, all stopped by :meth:`close`.

    An instance found dead (killed by a scenario that failed before restarting it) is started
    again, so one scenario's crash does not fail the next ones.
    """

    def __init__(self, *, bootstrap: str, root: Path, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.root = root
        self.partitions = partitions
        self._running: dict[str, InstanceProcess] = {}

    def get(self, service: str) -> InstanceProcess:
        """The running, ready instance of ``service`` (``package.module:attribute``)."""
        instance = self._running.get(service)
        if instance is None:
            name = service.replace(":", ".").replace(".", "-")
            instance = InstanceProcess(
                bootstrap=self.bootstrap,
                state_dir=self.root / name / "state",
                service=service,
                partitions=self.partitions,
            )
            self._running[service] = instance
        if instance.process is None or instance.process.poll() is not None:
            instance.start()
            instance.wait_ready()
        return instance

    def close(self) -> None:
        for instance in self._running.values():
            instance.stop()
        self._running.clear()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """The embedded broker (Tansu) on a free 127.0.0.1 port, for the whole session."""
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as running:
        yield running


@pytest.fixture(scope="session")
def foldstream_service() -> str:
    """The import path of the service the ``instance`` fixture runs: override it in conftest.py."""
    pytest.fail(
        "no service under test: define a session fixture `foldstream_service` returning the "
        "service's import path (e.g. 'my_service.query_api:service') in the root conftest.py"
    )


@pytest.fixture(scope="session")
def foldstream_partitions() -> int:
    """Partitions of every service's events topic in this session (override to change)."""
    return 4


@pytest.fixture(scope="module")
def instances(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory, foldstream_partitions: int
) -> Iterator[InstancePool]:
    """Running instances for this test module (starting one costs a JVM and Spark: ~15 s)."""
    pool = InstancePool(
        bootstrap=broker.bootstrap,
        root=tmp_path_factory.mktemp("instances"),
        partitions=foldstream_partitions,
    )
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def instance(instances: InstancePool, foldstream_service: str) -> InstanceProcess:
    """A running instance of the service under test (steps may switch it to another service)."""
    return instances.get(foldstream_service)
