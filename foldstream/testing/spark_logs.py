"""What Spark's logs say ran where, on a cluster whose logging keeps it (:data:`LOG4J2`, which
:class:`~foldstream.testing.spark_cluster.SparkStandaloneCluster` installs): each executor
logs the task attempts it runs (``Running task 0.1 in stage 2.0 (TID 3)``), the driver each
task it lost with its executor and each executor loss it handled. The strings are Spark 4's
(pyspark is pinned); ``tests/test_spark_cluster_logs.py`` holds lines Spark wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: Warnings only, but the standalone deploy's notes (executors added, lost), each executor's
#: task log and the driver's (tasks started, finished, lost with their executor; executors
#: lost): what ran where.
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = info
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = info
logger.dag.name = org.apache.spark.scheduler.DAGScheduler
logger.dag.level = info
"""
_TASK = r"task (\d+)\.(\d+) in stage (\d+)\.\d+ \(TID (\d+)\)"
_RUNNING = re.compile(rf"Running {_TASK}")
_LOST = re.compile(rf"{_TASK} failed because while it was being computed, its executor exited")


@dataclass(frozen=True)
class TaskAttempt:
    """One attempt of a Spark task (``task <index>.<attempt> in stage <stage>.<n> (TID
    <tid>)`` in Spark's logs)."""

    stage: int
    index: int
    attempt: int
    tid: int


def _attempts(found: list[tuple[str, str, str, str]]) -> list[TaskAttempt]:
    return [
        TaskAttempt(stage=int(stage), index=int(index), attempt=int(attempt), tid=int(tid))
        for index, attempt, stage, tid in found
    ]


def task_attempts_in(executor_log: str) -> list[TaskAttempt]:
    """Every task attempt an executor's log says it started."""
    return _attempts(_RUNNING.findall(executor_log))


def executor_lost(driver_log: str, executor_id: str) -> bool:
    """Whether the driver's log says it handled the loss of executor ``executor_id``: its
    scheduler has failed the tasks the executor was running by then (:func:`tasks_lost`)."""
    return f"Executor lost: {executor_id} (epoch" in driver_log


def tasks_lost(driver_log: str) -> list[TaskAttempt]:
    """The task attempts the driver's log says failed because their executor was lost while
    running them (Spark runs them again, and does not count the failure)."""
    return _attempts(_LOST.findall(driver_log))


def read_log(path: Path) -> str:
    """The text of ``path``, empty while it does not exist."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
