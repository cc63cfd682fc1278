"""State that outlives its topics, on a broker and an instance run by hand as the README says
(`foldstream broker --data-dir .kafka`, `foldstream serve --state-dir .foldstream`), or on a
broker that keeps nothing (no `--data-dir`), each in a process group of its own, stopped with
Ctrl-C (SIGINT to the group) as in a terminal.

The steps are this repository's own: the generic ones (commands, lookups, readiness, plain
folds) come from :mod:`foldstream.testing.steps` and run against the instance run by hand.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.broker import free_port
from foldstream.kafka import TopicSpec, partition_for
from foldstream.process import InstanceProcess
from foldstream.testing.kafka import create_again
from foldstream.testing.steps import service_of

scenarios("stale_state.feature")

#: The `foldstream` command of this environment, as the README runs it (`.venv/bin/foldstream`).
FOLDSTREAM = str(Path(sys.executable).with_name("foldstream"))
STOP_S = 120.0  # an instance stopping on a loaded machine: Spark's shutdown
READY_S = 300.0  # an instance starting on a loaded machine: Spark's start took over 2 minutes


def _ctrl_c(process: subprocess.Popen[bytes], what: str) -> None:
    """SIGINT to ``process``'s group, as Ctrl-C in its terminal, and wait for a clean exit."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        status = process.wait(STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"{what} did not stop within {STOP_S}s of Ctrl-C")
    assert status == 0, f"{what} exited with {status} on Ctrl-C"


def _dies_with_this_process(command: list[str]) -> list[str]:
    # A test run killed with kill -9 leaves no broker behind (its nodes die with
    # `foldstream broker`); the instance has exit_with_parent.
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else command


class ByHandBroker:
    """``foldstream broker --port N`` run in ``workdir``."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.workdir = workdir
        self.port = port
        self.log_path = workdir / "broker.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.keeps_data = True

    def run(self) -> None:
        """``foldstream broker --port P``, with ``--data-dir .kafka`` as the README has it when
        :attr:`keeps_data`."""
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [FOLDSTREAM, "broker", "--port", str(self.port)]
        if self.keeps_data:
            command += ["--data-dir", ".kafka"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                _dies_with_this_process(command),
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while b"KAFKA_BOOTSTRAP_SERVERS=" not in self.log_path.read_bytes()[start:]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the broker did not start: {self.log_path.read_text()[start:]}")
            time.sleep(0.05)

    def interrupt(self) -> None:
        assert self.process is not None, "the broker is not running"
        _ctrl_c(self.process, "foldstream broker")
        self.process = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None


class ByHandInstance(InstanceProcess):
    """``KAFKA_BOOTSTRAP_SERVERS=… foldstream serve --port N --state-dir .foldstream`` run in
    the directory holding ``state_dir`` (the README's defaults otherwise: 6 partitions)."""

    def _spawn(self, log: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        command = [FOLDSTREAM, "serve", "--port", str(self.port), "--state-dir", ".foldstream"]
        return subprocess.Popen(
            command,
            cwd=self.state_dir.parent,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def interrupt(self) -> None:
        assert self.process is not None, "the instance is not running"
        _ctrl_c(self.process, "foldstream serve")
        self.process = None


class ByHand:
    """The broker and the instance, and where the instance's log stood at its last start."""

    def __init__(self, workdir: Path) -> None:
        self.broker = ByHandBroker(workdir, free_port())
        self.instance = ByHandInstance(
            bootstrap=f"127.0.0.1:{self.broker.port}",
            state_dir=workdir / ".foldstream",
            partitions=6,
            port=free_port(),
        )
        self.log_start = 0

    def run_instance(self) -> None:
        """Start the instance and wait until it is ready."""
        log = self.instance.log_path
        self.log_start = log.stat().st_size if log.exists() else 0
        self.instance.start()
        self.instance.wait_ready(timeout=READY_S)

    def ensure_running(self, *, keeps_data: bool) -> None:
        if self.broker.keeps_data != keeps_data:
            self.instance.stop()
            self.broker.kill()
            self.broker.keeps_data = keeps_data
        if self.broker.process is None or self.broker.process.poll() is not None:
            self.instance.stop()
            self.broker.run()
        if self.instance.process is None or self.instance.process.poll() is not None:
            self.run_instance()

    def log_since_start(self) -> list[str]:
        with open(self.instance.log_path, "rb") as log:
            log.seek(self.log_start)
            return log.read().decode(errors="replace").splitlines()

    def close(self) -> None:
        self.instance.stop()
        self.broker.kill()


@pytest.fixture(scope="module")
def by_hand(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ByHand]:
    pair = ByHand(tmp_path_factory.mktemp("by-hand"))
    try:
        yield pair
    finally:
        pair.close()


@given("the broker and an instance run by hand as the README says", target_fixture="instance")
def run_by_hand(by_hand: ByHand) -> InstanceProcess:
    by_hand.ensure_running(keeps_data=True)
    return by_hand.instance


@given("a broker that keeps nothing and an instance run by hand", target_fixture="instance")
def run_by_hand_on_nothing_kept(by_hand: ByHand) -> InstanceProcess:
    by_hand.ensure_running(keeps_data=False)
    return by_hand.instance


@when("both are stopped with Ctrl-C and run again the same way")
def stop_both_and_run_again(by_hand: ByHand) -> None:
    by_hand.instance.interrupt()
    by_hand.broker.interrupt()
    by_hand.broker.run()
    by_hand.run_instance()


@when(
    parsers.re(
        r"the instance is stopped with Ctrl-C, the topics? (?P<topics>.+) (?:is|are) deleted and "
        r"created again, and the instance is run again"
    )
)
def create_topics_again(by_hand: ByHand, topics: str) -> None:
    _, settings = service_of(by_hand.instance)
    names = re.findall(r'"([^"]+)"', topics)
    by_hand.instance.interrupt()
    create_again(
        by_hand.instance.bootstrap,
        [
            TopicSpec(name, settings.partitions, compact=name != settings.events_topic)
            for name in names
        ],
    )
    by_hand.run_instance()


@then(
    parsers.parse(
        'the instance said once that it rebuilt the copy of store "{store}" holding "{key}", '
        'because "{reason}"'
    )
)
def rebuilt_once(by_hand: ByHand, store: str, key: str, reason: str) -> None:
    """One warning line since the instance's last start for the copy of the key's partition,
    naming the store, the partition and why; and at most one for any other copy."""
    partition = partition_for(key.encode(), by_hand.instance.partitions)
    lines = [line for line in by_hand.log_since_start() if ": discarding its local copy" in line]
    copies = [line.split(": discarding")[0].rpartition(": ")[2] for line in lines]
    assert len(set(copies)) == len(copies), lines
    [line] = [line for line in lines if f"store '{store}' partition {partition}:" in line] or [""]
    assert reason in line, lines
