"""The SparkSession foldstream's projections run in, with the settings freshness depends on."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from foldstream.java import find_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# C1 only and the serial collector: a projection's JVM mostly plans micro-batches and runs their
# tasks; C2 and parallel GC threads cost more CPU and memory than they return on few cores. A
# small initial heap: the default is 1/64 of the machine's memory, and the young generation
# sized from it is all touched, while a projection needs a fraction of it. The measurements are
# in docs/decisions.md ("The Spark session").
JVM_OPTIONS = "-Dlog4j.rootLogger=WARN -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xms64m"
# Hadoop's default local checkpoint manager forks a process per rename: tens of ms per batch.
FAST_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

#: Attempts of a failed task in local mode, where Spark's default is one (``local[N]``): a task
#: can fail transiently (seen: task deserialisation racing a query start), and a retried task
#: applies nothing twice because the fold skips the offsets its stores already hold.
LOCAL_TASK_ATTEMPTS = 4
_LOCAL_MASTER = re.compile(r"local(?:\[([^,\]]+)\])?")
_ANY_LOCAL_MASTER = re.compile(r"local(?:\[[^\]]+\])?")


def is_local(master: str) -> bool:
    """Whether ``master`` runs the tasks inside the driver's JVM (``local``, ``local[N]``,
    ``local[N,F]``, ``local[*]``), on this machine."""
    return _ANY_LOCAL_MASTER.fullmatch(master) is not None


def with_task_retries(master: str) -> str:
    """``master`` with :data:`LOCAL_TASK_ATTEMPTS` for a local master that names none
    (``local``, ``local[N]``, ``local[*]``); any other master as it is: a cluster's
    ``spark.task.maxFailures`` (4 by default) applies there."""
    matched = _LOCAL_MASTER.fullmatch(master)
    if matched is None:
        return master
    return f"local[{matched.group(1) or 1},{LOCAL_TASK_ATTEMPTS}]"


def check_java() -> int:
    """The Java major version; raises with the remedy when Java is missing or too old."""
    return find_java("Spark")[1]


_WORKER_PYTHON = """#!/bin/sh
# Spark's Python workers without Spark's zips and jars on PYTHONPATH (written by foldstream).
new=
IFS=:
for entry in $PYTHONPATH; do
    case $entry in
        "{home}"/python/lib/*.zip | "{home}"/jars/*.jar) ;;
        *) new=${{new:+$new:}}$entry ;;
    esac
done
unset IFS
PYTHONPATH=$new exec "{python}" "$@"
"""


def worker_python(master: str = "local[*]") -> str:
    """The Python that Spark starts its workers with: this interpreter, for a local master
    through a wrapper that keeps Spark's ``pyspark.zip`` (and jars, which Python scans as zips)
    off their path when pyspark is pip-installed.

    Any other master gets the interpreter's own path: Spark starts every executor's Python
    workers with the driver's path, and the wrapper is a file in this machine's temp directory,
    which executors on other machines do not have.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path, and
    Python caches no bytecode for modules imported from a zip: each new worker (planner, source,
    task reader) recompiled the pyspark modules it imports from source, which
    py-spy showed as the largest CPU cost of a projection's start and first batches. With a pip
    install the zip holds the very same files as the installed package, which has bytecode.
    """
    import pyspark

    home = Path(pyspark.__file__).parent  # SPARK_HOME of a pip install
    if not is_local(master) or not (home / "python" / "lib").is_dir():
        return sys.executable
    script = _WORKER_PYTHON.format(home=home, python=sys.executable)
    digest = hashlib.sha256(script.encode()).hexdigest()[:12]
    wrapper = Path(tempfile.gettempdir()) / f"foldstream-spark-python-{digest}"
    if not wrapper.exists():
        staged = wrapper.with_name(f"{wrapper.name}.{os.getpid()}")
        staged.write_text(script)
        staged.chmod(0o755)
        staged.replace(wrapper)
    return str(wrapper)


#: The Python foldstream chose for Spark's workers in this process, inherited by the processes
#: it starts: what tells its choice from a user's ``PYSPARK_PYTHON``.
CHOSEN_PYTHON_ENV = "FOLDSTREAM_PYSPARK_PYTHON"


def use_worker_python(python: str) -> None:
    """Have Spark start its Python workers with ``python``, unless the user chose another with
    ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON``.

    A choice foldstream made in a parent process (a test run or a bench that opened a session,
    then started an instance of another project's venv) is not the user's: the child's workers
    would run the parent's interpreter, which may not have the child's service installed."""
    inherited = os.environ.get(CHOSEN_PYTHON_ENV)
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        current = os.environ.get(name)
        if current is None or current == inherited:
            os.environ[name] = python
    os.environ[CHOSEN_PYTHON_ENV] = python


def spark_session(
    master: str = "local[*]",
    app_name: str = "foldstream",
    *,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with foldstream's data sources registered; ``conf``: more Spark
    settings, over foldstream's (e.g. a cluster's executors' JVM options).

    Settings foldstream does not make come from ``spark-defaults.conf`` in ``SPARK_CONF_DIR``,
    as for any Spark application: on a cluster, the executors' memory and JVM options, the
    driver's address they reach (docs/operations/spark-cluster.md).
    """
    check_java()
    # Executors' Python workers must import the same foldstream (and service) as the driver;
    # the driver-side ones (data source planning, streaming source commit) too.
    use_worker_python(worker_python(master))
    from pyspark.sql import SparkSession

    from foldstream.projections.datasources import FoldSource
    from foldstream.projections.worker import pandas_hidden

    # py4j's argument converters import pyspark.testing.utils, which imports pandas (memory and
    # CPU of the instance's process) only to tell pyspark's own tests whether it is there;
    # nothing here uses it.
    with pandas_hidden():
        import pyspark.testing.utils  # noqa: F401

    builder = (
        SparkSession.builder.master(with_task_retries(master))
        .appName(app_name)
        .config("spark.sql.streaming.checkpointFileManagerClass", FAST_CHECKPOINTS)
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "foldstream.projections.daemon")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Spark's status store keeps every micro-batch's SQL execution, jobs, stages and tasks
        # (up to 1,000 / 1,000 / 1,000 / 100,000 by default) even without the UI: at several
        # micro-batches a second that is heap an instance holds for nothing, growing until the
        # limits (docs/decisions.md, "The Spark session").
        .config("spark.ui.retainedJobs", "50")
        .config("spark.ui.retainedStages", "50")
        .config("spark.ui.retainedTasks", "500")
        .config("spark.sql.ui.retainedExecutions", "20")
        .config("spark.sql.streaming.ui.retainedProgressUpdates", "20")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        # The JVM plans micro-batches and runs their tasks (the records stay in Python): half
        # the default heap is plenty and keeps an instance's tree within its memory budget.
        .config("spark.driver.memory", "512m")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(FoldSource)
    return session
