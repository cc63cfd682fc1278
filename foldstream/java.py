"""Finding a Java runtime: Spark and the Apache Kafka broker both run on one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from foldstream.errors import EnvironmentNotReady

MIN_JAVA = 17
JAVA_REMEDY = "install it, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME"


def find_java(needed_by: str) -> tuple[str, int]:
    """The ``java`` of ``$JAVA_HOME`` or the ``PATH`` and its major version, 17 or later;
    raises :class:`EnvironmentNotReady` naming what needs it (``needed_by``) and the remedy."""
    java = (
        shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin"))
        if os.environ.get("JAVA_HOME")
        else shutil.which("java")
    )
    if java is None:
        raise EnvironmentNotReady(
            f"{needed_by} needs Java {MIN_JAVA} or later, but `java` was not found: {JAVA_REMEDY}"
        )
    output = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if not match:
        raise EnvironmentNotReady(f"cannot tell the Java version from {output!r}: {JAVA_REMEDY}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise EnvironmentNotReady(
            f"{needed_by} needs Java {MIN_JAVA} or later, found {major}: {JAVA_REMEDY}"
        )
    return java, major
