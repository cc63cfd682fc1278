"""Reading Spark's logs for what ran where (foldstream.testing.spark_logs), on lines Spark
4.3 wrote in this repo's Spark cluster feature."""

from __future__ import annotations

from foldstream.testing.spark_logs import (
    TaskAttempt,
    executor_lost,
    task_attempts_in,
    tasks_lost,
)

EXECUTOR_LOG = """\
26/11/25 22:56:33.431 INFO Executor: Running task 0.0 in stage 0.0 (TID 0)
26/11/25 22:56:57.436 INFO Executor: Finished task 0.0 in stage 0.0 (TID 0). 2407 bytes result sent to driver
26/11/25 22:57:15.466 INFO Executor: Running task 0.1 in stage 2.0 (TID 3)
"""  # noqa: E501
DRIVER_LOG = """\
26/11/25 22:57:03.334 INFO TaskSetManager: [queryId = b226c] [batchId = 2] Starting task 0.0 in stage 2.0 (TID 2) (127.0.0.1,executor 1, partition 0, PROCESS_LOCAL, 873333 bytes)
26/11/25 22:57:15.197 ERROR TaskSchedulerImpl: Lost executor 1 on 127.0.0.1: worker lost: 127.0.0.1:29991 got disassociated
26/11/25 22:57:15.354 INFO TaskSetManager: [queryId = b226c] [batchId = 2] task 0.0 in stage 2.0 (TID 2) failed because while it was being computed, its executor exited for a reason unrelated to the task. Not counting this failure towards the maximum number of failures for the task.
26/11/25 22:57:15.398 INFO DAGScheduler: Executor lost: 1 (epoch 0)
"""  # noqa: E501


def test_task_attempts_an_executor_started() -> None:
    assert task_attempts_in(EXECUTOR_LOG) == [
        TaskAttempt(stage=0, index=0, attempt=0, tid=0),
        TaskAttempt(stage=2, index=0, attempt=1, tid=3),
    ]


def test_tasks_the_driver_lost_with_their_executor() -> None:
    assert tasks_lost(DRIVER_LOG) == [TaskAttempt(stage=2, index=0, attempt=0, tid=2)]
    assert tasks_lost(EXECUTOR_LOG) == []


def test_executor_loss_handled_by_the_driver() -> None:
    assert executor_lost(DRIVER_LOG, "1")
    assert not executor_lost(DRIVER_LOG, "0")
    assert not executor_lost(DRIVER_LOG.replace("Executor lost: 1", "Executor lost: 11"), "1")
