"""Projections on a Spark standalone cluster: a master and two workers started from the pyspark
installation (:mod:`foldstream.testing.spark_cluster`), an instance of the service under test
whose ``--spark-master`` is that cluster's master.

Its own module: the cluster and the instance are started once for it (the instances of the
other modules, the same service, are stopped by then). The steps below are this repo's; the
others come from the step library::

    Given a Spark standalone cluster of 2 workers
    Given the service runs on the Spark cluster
    When a Spark worker is killed with kill -9 while it folds
    Then Spark runs the task it lost again on the surviving worker
    Then the projection's tasks ran in the executors of the Spark cluster, not in the instance
    Then the instance is still running, ready, without a restart

Whether a worker is folding is seen from outside: its Python workers use CPU only while they
run a task. Whether the kill caught a task is the driver's word: its scheduler logs each task
it lost with an executor (:func:`~foldstream.testing.spark_logs.tasks_lost`), which the
cluster's logging keeps. A kill that caught none (the task ended just before) is tried again
after the worker restarted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.broker import KafkaCluster
from foldstream.process import InstanceProcess
from foldstream.testing.proc_tree import command_line, descendants
from foldstream.testing.spark_cluster import SparkStandaloneCluster
from foldstream.testing.spark_logs import TaskAttempt, executor_lost, tasks_lost
from foldstream.testing.steps import WAIT, ScenarioState, wait_until

scenarios("spark_cluster.feature")

#: The Python daemon that Spark forks the projection's task workers from.
TASK_DAEMON = "foldstream.projections.daemon\0pyspark.worker"
#: Starting an instance on the cluster takes a JVM, executors on both workers and their Python.
START_TIMEOUT_S = 300.0
#: Kills tried until one catches a task: a task may end between the moment its worker was seen
#: folding and the kill.
KILLS = 5


@pytest.fixture(scope="module")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandaloneCluster]:
    """A standalone master and two workers (1 core, 1 GB each) for this module."""
    cluster = SparkStandaloneCluster(root=tmp_path_factory.mktemp("spark-standalone"), workers=2)
    with cluster:
        yield cluster


@pytest.fixture(scope="module")
def instance_on_cluster(
    broker: KafkaCluster,
    spark_standalone: SparkStandaloneCluster,
    tmp_path_factory: pytest.TempPathFactory,
    foldstream_service: str,
    foldstream_partitions: int,
) -> Iterator[InstanceProcess]:
    """An instance of the service under test whose projections run on ``spark_standalone``;
    started by the step that needs it, stopped before the cluster."""
    instance = InstanceProcess(
        bootstrap=broker.bootstrap,
        state_dir=tmp_path_factory.mktemp("on-spark-cluster") / "state",
        service=foldstream_service,
        partitions=foldstream_partitions,
        spark_master=spark_standalone.master_url,
        env=spark_standalone.driver_env,
    )
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def started_pid() -> dict[str, int]:
    """The instance's PID when the scenario began."""
    return {}


@pytest.fixture
def lost_tasks() -> list[TaskAttempt]:
    """The task attempts Spark lost with the worker a scenario killed."""
    return []


def _await_executor_loss(instance: InstanceProcess, start: int, executors: list[str]) -> str:
    """The driver's log from byte ``start`` on, once it says it handled the loss of every
    executor in ``executors``."""

    def handled() -> str:
        log = _driver_log(instance, start)
        return log if all(executor_lost(log, e) for e in executors) else ""

    return str(wait_until(handled, lambda: f"the driver did not say it lost executors {executors}"))


def _driver_log(instance: InstanceProcess, start: int) -> str:
    """The instance's log (its driver's among it) from byte ``start`` on."""
    with open(instance.log_path, "rb") as log:
        log.seek(start)
        return log.read().decode(errors="replace")


def _task_daemons(pid: int) -> list[int]:
    """The projection's task-worker daemons among ``pid``'s descendants (and the workers they
    forked, which share their command line)."""
    return [p for p in descendants(pid) if TASK_DAEMON in "\0".join(command_line(p))]


# Given ---------------------------------------------------------------------------------------


@given(parsers.parse("a Spark standalone cluster of {workers:d} workers"))
def standalone_cluster(spark_standalone: SparkStandaloneCluster, workers: int) -> None:
    """The module's cluster, its workers a scenario killed started again."""
    assert len(spark_standalone.workers) == workers, "the module's cluster has 2 workers"
    spark_standalone.ensure_workers()


@given("the service runs on the Spark cluster", target_fixture="instance")
def service_on_cluster(
    instance_on_cluster: InstanceProcess, started_pid: dict[str, int]
) -> InstanceProcess:
    instance = instance_on_cluster
    if instance.process is None or instance.process.poll() is not None:
        instance.start()
    instance.wait_ready(timeout=START_TIMEOUT_S)
    assert instance.process is not None
    started_pid["pid"] = instance.process.pid
    return instance


# When ----------------------------------------------------------------------------------------


@when("a Spark worker is killed with kill -9 while it folds")
def kill_folding_worker(
    spark_standalone: SparkStandaloneCluster,
    instance: InstanceProcess,
    scenario_state: ScenarioState,
    lost_tasks: list[TaskAttempt],
) -> None:
    """Once every worker's executor has run fold tasks, wait until a worker's Python runs one
    (uses CPU), SIGKILL that worker, its executor and its Python workers (all stopped first),
    and wait until the driver handled the loss; again (the worker restarted first) until a
    kill caught a task."""
    for _ in range(KILLS):
        writer = scenario_state.writer
        assert writer is not None and writer.is_alive(), f"no writer appends: {writer}"
        spark_standalone.ensure_workers()
        # Every worker's executor has its Python workers up (forked for a fold task), so the
        # CPU seen next is a task's work, not its Python starting.
        wait_until(
            lambda: all(spark_standalone.python_workers(w) for w in spark_standalone.workers),
            lambda: "a worker's executor has run no Python task yet",
        )
        start = instance.log_path.stat().st_size
        killed = spark_standalone.kill_worker(spark_standalone.busy_worker(timeout=WAIT))
        assert killed.executors, f"{killed.name} ran no executor: {killed.pids}"
        handled = _await_executor_loss(instance, start, killed.executors)
        lost_tasks += tasks_lost(handled)
        print(f"killed {killed.name} (PIDs {killed.pids}); tasks lost: {lost_tasks}")
        if lost_tasks:
            return
    pytest.fail(f"none of {KILLS} kills caught a task in flight")


# Then ----------------------------------------------------------------------------------------


@then("the projection's tasks ran in the executors of the Spark cluster, not in the instance")
def tasks_on_executors(spark_standalone: SparkStandaloneCluster, instance: InstanceProcess) -> None:
    """A worker runs the task-worker daemon (so its executor ran a fold task, and Spark gave it
    ``spark.python.daemon.module``); the instance's own process tree runs none."""
    assert instance.process is not None

    def on_workers() -> list[int]:
        return [
            daemon
            for worker in spark_standalone.workers
            if worker.pid is not None
            for daemon in _task_daemons(worker.pid)
        ]

    wait_until(on_workers, lambda: "no worker runs foldstream's Python task daemon")
    assert not _task_daemons(instance.process.pid), "the instance's own JVM ran fold tasks"


@then("Spark runs the task it lost again on the surviving worker")
def lost_task_rerun(
    spark_standalone: SparkStandaloneCluster, lost_tasks: list[TaskAttempt]
) -> None:
    """Each lost task is run again, as a later attempt, by a worker still alive."""
    survivors = [w for w in spark_standalone.workers if w.alive()]

    def rerun() -> bool:
        ran = [a for w in survivors for a in spark_standalone.task_attempts(w)]
        return all(
            any((a.stage, a.index) == (t.stage, t.index) and a.attempt > t.attempt for a in ran)
            for t in lost_tasks
        )

    wait_until(rerun, lambda: f"no survivor ran {lost_tasks} again")


@then("the instance is still running, ready, without a restart")
def still_running(instance: InstanceProcess, started_pid: dict[str, int]) -> None:
    assert instance.process is not None and instance.process.poll() is None, instance.log_tail()
    assert instance.process.pid == started_pid["pid"], "the instance was restarted"
    instance.wait_ready(timeout=WAIT)
