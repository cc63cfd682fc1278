"""The SparkSession foldstream's projections run in, with the settings freshness depends on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from foldstream.errors import EnvironmentNotReady

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17
# Hadoop's default local checkpoint manager forks a process per rename: tens of ms per batch.
FAST_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def check_java() -> int:
    """The Java major version; raises with the remedy when Java is missing or too old."""
    java = (
        shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin"))
        if os.environ.get("JAVA_HOME")
        else shutil.which("java")
    )
    remedy = "install it, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME"
    if java is None:
        raise EnvironmentNotReady(
            f"Spark needs Java {MIN_JAVA} or 21, but `java` was not found: {remedy}"
        )
    output = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if not match:
        raise EnvironmentNotReady(f"cannot tell the Java version from {output!r}: {remedy}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise EnvironmentNotReady(f"Spark needs Java >= {MIN_JAVA}, found {major}: {remedy}")
    return major


def spark_session(master: str = "local[*]", app_name: str = "foldstream") -> SparkSession:
    """A SparkSession with foldstream's sources and sinks registered."""
    check_java()
    # Executors' Python workers must import the same foldstream (and service) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from foldstream.projections.sink import StoreSink
    from foldstream.projections.source import KafkaSource

    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.streaming.checkpointFileManagerClass", FAST_CHECKPOINTS)
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.driver.extraJavaOptions", "-Dlog4j.rootLogger=WARN")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(KafkaSource)
    session.dataSource.register(StoreSink)
    return session
