"""Apache Kafka's jars (and any other jars foldstream needs, :func:`maven_jars`), fetched from
Maven Central with Maven into a cache on first use.

Kafka publishes its broker as ordinary Maven artifacts (``org.apache.kafka:kafka_2.13`` and what
it needs at run time); Maven itself resolves them, so foldstream needs no download code of its
own. The cache holds one directory of jars per Kafka version, made complete before it is used
(it is filled under another name and renamed), and shared by every process under a file lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from foldstream.errors import EnvironmentNotReady

KAFKA_VERSION = "4.4.0"
# Kafka logs through SLF4J; this binding sends it to log4j2, which Kafka already depends on,
# at the version of log4j-core that Kafka's release resolves to. The binding needs SLF4J 2's API
# (Kafka's own dependencies resolve to 1.7, which finds no binding and logs nothing).
LOG4J_VERSION = "2.25.5"
SLF4J_VERSION = "2.0.17"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
LIBS_ENV = "FOLDSTREAM_KAFKA_LIBS"
CACHE_ENV = "FOLDSTREAM_CACHE_DIR"
COMPLETE = ".complete"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>foldstream</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""
_DOWNLOADED = re.compile(
    r"Downloaded from \S+: \S+/([^/\s]+\.(?:jar|pom)) \(([^)]*?)(?: at [^)]*)?\)"
)


def cache_root() -> Path:
    """Where foldstream keeps what it fetches: ``$FOLDSTREAM_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/foldstream``, else ``~/.cache/foldstream``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "foldstream"


def kafka_libs(
    version: str = KAFKA_VERSION, *, progress: Callable[[str], None] | None = None
) -> Path:
    """The directory of Apache Kafka ``version``'s jars (a broker's class path is its ``*``).

    ``$FOLDSTREAM_KAFKA_LIBS`` names one to use as it is. Otherwise the jars are fetched with
    Maven into :func:`cache_root` the first time (:func:`maven_jars`)."""
    explicit = os.environ.get(LIBS_ENV)
    if explicit:
        return _checked_libs(Path(explicit))
    pom = _POM.format(version=version, log4j=LOG4J_VERSION, slf4j=SLF4J_VERSION)
    return maven_jars(
        f"kafka-{version}",
        pom,
        what=f"Apache Kafka {version}",
        remedy=f"set {LIBS_ENV} to a directory of Kafka's jars",
        progress=progress,
    )


def maven_jars(
    name: str,
    pom: str,
    *,
    what: str,
    remedy: str,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The directory of the jars ``pom`` needs at run time, fetched with Maven into
    :func:`cache_root` (``<name>-<digest of the POM>/libs``) the first time, telling
    ``progress`` (default: standard error) what is fetched; raises
    :class:`EnvironmentNotReady` naming ``what`` and, beside installing or reaching Maven,
    ``remedy`` when Maven is missing or cannot fetch them."""
    # Named for what the POM asks too: a changed POM fetches into a directory of its own.
    home = cache_root() / f"{name}-{hashlib.sha256(pom.encode()).hexdigest()[:8]}"
    libs = home / "libs"
    if (libs / COMPLETE).exists():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / ".lock"):
        if not (libs / COMPLETE).exists():  # another process may have fetched them meanwhile
            _fetch(pom, home, libs, what, remedy, progress or _to_stderr)
    return libs


def _checked_libs(libs: Path) -> Path:
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise EnvironmentNotReady(
            f"{LIBS_ENV}={libs} holds no kafka_2.13 jar: point it at a directory of Apache "
            "Kafka's jars (a Kafka release's libs/) or unset it to fetch them with Maven"
        )
    return libs


def _fetch(
    pom: str, home: Path, libs: Path, what: str, remedy: str, progress: Callable[[str], None]
) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise EnvironmentNotReady(
            f"{what}'s jars are fetched with Maven on first use, and `mvn` was not found: "
            f"install it (apt-get install maven), or {remedy}"
        )
    (home / "pom.xml").write_text(pom)
    partial = home / "libs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    progress(f"fetching {what} with Maven into {libs} (first use only)")
    command = [
        mvn,
        "--batch-mode",
        "--file",
        str(home / "pom.xml"),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={partial}",
    ]
    failure = _run_maven(command, progress)
    if failure is not None:
        raise EnvironmentNotReady(
            f"Maven could not fetch {what}: {failure}; check that this machine reaches Maven "
            f"Central (repo.maven.apache.org), or {remedy}"
        )
    (partial / COMPLETE).write_text(what + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    progress(f"{what}: {sum(1 for _ in libs.glob('*.jar'))} jars in {libs}")


def _run_maven(command: list[str], progress: Callable[[str], None]) -> str | None:
    """Run Maven, telling ``progress`` of each jar it downloads; the first error it printed
    when it fails, else None."""
    errors: list[str] = []
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as maven:
        assert maven.stdout is not None
        for line in maven.stdout:
            downloaded = _DOWNLOADED.search(line)
            if downloaded and downloaded.group(1).endswith(".jar"):
                progress(f"  {downloaded.group(1)} ({downloaded.group(2)})")
            elif line.startswith("[ERROR]") and line[7:].strip():
                errors.append(line[7:].strip())
    if maven.returncode == 0:
        return None
    return errors[0] if errors else f"mvn exited with {maven.returncode}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
