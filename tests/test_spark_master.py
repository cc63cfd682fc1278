"""Local Spark masters get task retries and the worker wrapper; other masters are left as
configured and get this interpreter's own path."""

from __future__ import annotations

import os
import sys

import pytest

from foldstream.spark import (
    CHOSEN_PYTHON_ENV,
    LOCAL_TASK_ATTEMPTS,
    is_local,
    use_worker_python,
    with_task_retries,
    worker_python,
)


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


def test_only_local_masters_start_workers_through_the_wrapper() -> None:
    """The wrapper lives in this machine's temp directory: executors elsewhere lack it."""
    assert worker_python("spark://spark-master:7077") == sys.executable
    assert worker_python("k8s://https://kubernetes:443") == sys.executable
    local = worker_python("local[2]")
    assert local == sys.executable or "foldstream-spark-python-" in local


@pytest.mark.parametrize(
    ("master", "local"),
    [("local", True), ("local[*]", True), ("local[2,4]", True), ("spark://h:7077", False)],
)
def test_is_local(master: str, local: bool) -> None:
    assert is_local(master) is local


@pytest.mark.parametrize(
    ("environ", "chosen"),
    [
        ({}, "/venv/bin/python"),
        # foldstream's choice in a parent process (another venv): replaced
        (
            {"PYSPARK_PYTHON": "/parent/python", "FOLDSTREAM_PYSPARK_PYTHON": "/parent/python"},
            "/venv/bin/python",
        ),
        # the user's own choice: kept
        ({"PYSPARK_PYTHON": "/user/python"}, "/user/python"),
        (
            {"PYSPARK_PYTHON": "/user/python", "FOLDSTREAM_PYSPARK_PYTHON": "/parent/python"},
            "/user/python",
        ),
    ],
)
def test_the_workers_python_is_the_users_or_this_processs_never_a_parents_choice(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], chosen: str
) -> None:
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", CHOSEN_PYTHON_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    use_worker_python("/venv/bin/python")
    assert os.environ["PYSPARK_PYTHON"] == chosen
    assert os.environ[CHOSEN_PYTHON_ENV] == "/venv/bin/python"
