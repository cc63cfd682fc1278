"""The command line: its version, and the one ``error:`` line ``serve`` prints, before any
server starts, for a bad state directory, missing Java or an unreachable broker; JSON logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from foldstream.api_docs import foldstream_version
from foldstream.broker import KafkaCluster, free_port


def foldstream(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "FOLDSTREAM_PARENT_PID": "", **(env or {})},
        check=False,
    )


def test_version() -> None:
    done = foldstream("--version")
    assert done.returncode == 0
    assert done.stdout == f"foldstream {foldstream_version()}\n"


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line ``serve`` printed last on stderr (after log lines, if any),
    with no traceback."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and "Traceback" not in done.stderr, done.stderr
    return lines[-1]


def serve(state_dir: Path, bootstrap: str, env: dict[str, str] | None = None) -> str:
    done = foldstream(
        "serve", "--port", str(free_port()), "--state-dir", str(state_dir),
        "--bootstrap", bootstrap, env=env,
    )  # fmt: skip
    return one_error_line(done)


def test_a_state_directory_that_is_a_file(tmp_path: Path, broker: KafkaCluster) -> None:
    taken = tmp_path / "state"
    taken.write_text("not a directory")
    line = serve(taken, broker.bootstrap)
    assert line == f"error: state directory '{taken}' is not a directory"
    line = serve(taken / "below", broker.bootstrap)
    assert line.startswith(f"error: cannot create state directory '{taken / 'below'}'")


def test_missing_java(tmp_path: Path, broker: KafkaCluster) -> None:
    line = serve(tmp_path / "state", broker.bootstrap, env={"JAVA_HOME": str(tmp_path / "nojava")})
    assert "Spark needs Java" in line and "`java` was not found" in line


def test_an_unreachable_broker(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    line = serve(tmp_path / "state", nobody, env={"FOLDSTREAM_BROKER_WAIT_S": "2"})
    assert line.startswith(f"error: no Kafka broker answered at {nobody} within 2s")


@pytest.mark.parametrize("style", ["json", "text"])
def test_log_format(style: str) -> None:
    program = (
        "import logging\n"
        "from foldstream.serving import configure_logging\n"
        "configure_logging()\n"
        "log = logging.getLogger('foldstream.check')\n"
        "log.info('took %d partitions', 3)\n"
        "try:\n"
        "    raise ValueError('bad')\n"
        "except ValueError:\n"
        "    log.exception('it failed')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**os.environ, "FOLDSTREAM_LOG_FORMAT": style},
        check=True,
    )
    if style == "text":
        assert " INFO foldstream.check: took 3 partitions" in done.stderr
        return
    first, second = (json.loads(line) for line in done.stderr.splitlines()[:2])
    assert first["level"] == "INFO" and first["logger"] == "foldstream.check"
    assert first["message"] == "took 3 partitions" and first["time"].endswith("+00:00")
    assert second["message"] == "it failed" and "ValueError: bad" in second["exception"]
    assert len(done.stderr.splitlines()) == 2  # the traceback is inside the object


def test_an_unknown_log_format_is_one_error_line(tmp_path: Path) -> None:
    done = foldstream("serve", "--state-dir", str(tmp_path), env={"FOLDSTREAM_LOG_FORMAT": "xml"})
    assert one_error_line(done) == "error: FOLDSTREAM_LOG_FORMAT='xml': use 'text' or 'json'"
