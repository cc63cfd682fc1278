"""The foldstream pytest plugin: one real broker per session and real instances per module.

Load it from the project's root ``conftest.py`` and name the service under test::

    pytest_plugins = ["foldstream.testing.plugin"]

    @pytest.fixture(scope="session")
    def foldstream_service() -> str:
        return "my_service.query_api:service"

It loads the step library (:mod:`foldstream.testing.steps` and the modules by theme it lists;
for ``GET /metrics`` :mod:`foldstream.testing.metrics_steps`; for poison records
:mod:`foldstream.testing.poison_steps` and :mod:`foldstream.testing.replay_steps`; for ordered
and windowed stores :mod:`foldstream.testing.ordered_steps`; for re-keyed, chained and joined
stores :mod:`foldstream.testing.graph_steps`) as well, so feature files can use its sentences
with nothing but ``scenarios(...)`` in a test module. The sentences about several instances of
a service are an opt-in plugin of their own: :mod:`foldstream.testing.cluster_plugin`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess, wait_cluster_stable

# The opt-in cluster plugin's modules are imported by sentences loaded here: their asserts are
# rewritten all the same, whether or not the project loads that plugin.
pytest.register_assert_rewrite(
    "foldstream.testing.cluster_steps", "foldstream.testing.cluster_checks"
)

#: The session timeout of the instances started here, unless a cluster asks for another.
SESSION_TIMEOUT_MS = 3000

pytest_plugins = [  # a module before those that import it, so that pytest rewrites its asserts
    "foldstream.testing.scenario",
    "foldstream.testing.instance_steps",
    "foldstream.testing.command_steps",
    "foldstream.testing.topic_steps",
    "foldstream.testing.store_steps",
    "foldstream.testing.steps",
    "foldstream.testing.poison_steps",
    "foldstream.testing.replay_steps",
    "foldstream.testing.metrics_steps",
    "foldstream.testing.ordered_steps",
    "foldstream.testing.graph_steps",
]


class InstancePool:
    """Instances started on first use, all stopped by :meth:`close`: one per service path
    (:meth:`get`), and clusters of several instances of a service (:meth:`cluster`).

    An instance found dead (killed by a scenario that failed before restarting it, or on
    purpose) is started again, so one scenario's crash does not fail the next ones. Do not mix
    :meth:`get` and :meth:`cluster` of one service in a module: the single instance would join
    the cluster.
    """

    def __init__(self, *, bootstrap: str, root: Path, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.root = root
        self.partitions = partitions
        self._running: dict[str, InstanceProcess] = {}
        self._clusters: dict[tuple[str, int, int], list[InstanceProcess]] = {}

    def _new(
        self,
        service: str,
        state_dir: str,
        server: str = "uvicorn",
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
    ) -> InstanceProcess:
        name = service.replace(":", ".").replace(".", "-")
        return InstanceProcess(
            bootstrap=self.bootstrap,
            state_dir=self.root / name / state_dir,
            service=service,
            partitions=self.partitions,
            server=server,
            session_timeout_ms=session_timeout_ms,
        )

    @staticmethod
    def _start_dead(instances: list[InstanceProcess]) -> None:
        """Start every instance that is not running, together, and wait until each is ready."""
        dead = [i for i in instances if i.process is None or i.process.poll() is not None]
        for instance in dead:
            instance.start()
        for instance in dead:
            instance.wait_ready()

    def get(self, service: str, server: str = "uvicorn") -> InstanceProcess:
        """The running, ready instance of ``service`` (``package.module:attribute``) on the
        HTTP ``server`` (``uvicorn`` or ``granian``)."""
        key = f"{service} on {server}"
        if key not in self._running:
            self._running[key] = self._new(service, f"state-{server}", server)
        instance = self._running[key]
        self._start_dead([instance])
        return instance

    def cluster(
        self, service: str, size: int, *, session_timeout_ms: int = SESSION_TIMEOUT_MS
    ) -> list[InstanceProcess]:
        """``size`` running instances of ``service`` sharing its partitions, each with its own
        state directory, once every partition has a live owner and a caught-up standby."""
        members = self._clusters.get((service, size, session_timeout_ms))
        if members is None:
            timeout = "" if session_timeout_ms == SESSION_TIMEOUT_MS else f"-{session_timeout_ms}"
            members = [
                self._new(service, f"cluster-{size}{timeout}-{n}", "uvicorn", session_timeout_ms)
                for n in range(1, size + 1)
            ]
            self._clusters[(service, size, session_timeout_ms)] = members
        self._start_dead(members)
        wait_cluster_stable(members)
        return members

    def joiner(self, service: str, size: int) -> InstanceProcess:
        """A further instance of the ``size``-instance cluster of ``service``, not started:
        the caller starts it and stops it (:meth:`close` stops it too)."""
        joiner = self._new(service, f"cluster-{size}-joiner")
        self._running[f"{service} joining {size}"] = joiner
        return joiner

    def close(self) -> None:
        for instance in [*self._running.values(), *(i for c in self._clusters.values() for i in c)]:
            instance.stop()
        self._running.clear()
        self._clusters.clear()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """An Apache Kafka node on free 127.0.0.1 ports, for the whole session (its logs, and
    ``node-1/server.log``, under the session's temporary directory)."""
    data = tmp_path_factory.mktemp("kafka")
    with KafkaCluster(data_dir=data) as running:
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
    broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory, foldstream_partitions: int
) -> Iterator[InstancePool]:
    """Running instances and clusters for this test module (starting an instance costs a JVM
    and Spark: ~15 s)."""
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
