"""Local Spark masters get task retries; other masters are left as configured."""

from __future__ import annotations

import pytest

from foldstream.spark import LOCAL_TASK_ATTEMPTS, with_task_retries


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", f"local[1,{LOCAL_TASK_ATTEMPTS}]"),
        ("local[2]", f"local[2,{LOCAL_TASK_ATTEMPTS}]"),
        ("local[*]", f"local[*,{LOCAL_TASK_ATTEMPTS}]"),
        ("local[2,1]", "local[2,1]"),
        ("spark://spark-master:7077", "spark://spark-master:7077"),
        ("local-cluster[2,1,1024]", "local-cluster[2,1,1024]"),
        ("k8s://https://kubernetes:443", "k8s://https://kubernetes:443"),
    ],
)
def test_local_masters_retry_failed_tasks(master: str, expected: str) -> None:
    assert with_task_retries(master) == expected
