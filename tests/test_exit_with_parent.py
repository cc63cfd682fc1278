"""An instance started by :class:`~foldstream.process.InstanceProcess` stops once the process
that started it is gone, even by ``kill -9``: real processes, the instance's watch without the
instance around it. So does an embedded broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from foldstream.process import PARENT_PID_ENV
from foldstream.testing.steps import wait_until

# Stands for `foldstream serve`, which calls exit_with_parent() first; it prints a line once
# it watches.
CHILD = textwrap.dedent(
    """
    import time
    from foldstream.process import exit_with_parent
    exit_with_parent(poll_s=0.05, grace_s=5)
    print("watching", flush=True)
    time.sleep(120)
    """
)
# An instance that does not stop on SIGTERM (stuck shutting down), with a process of its own
# (as its JVM is); it prints that process's PID once it watches.
STUCK_CHILD = textwrap.dedent(
    """
    import signal, subprocess, time
    from foldstream.process import exit_with_parent
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen(["sleep", "120"])
    exit_with_parent(poll_s=0.05, grace_s=0.5)
    print(worker.pid, flush=True)
    time.sleep(120)
    """
)


def parent_of(child: str) -> str:
    """Code standing for a test run or a bench: starts ``child`` as InstanceProcess does,
    prints the child's PID and the child's first line, then waits."""
    return textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        env = {{**os.environ, {PARENT_PID_ENV!r}: str(os.getpid())}}
        child = subprocess.Popen(
            [sys.executable, "-c", {child!r}],
            env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        print(child.pid, child.stdout.readline(), end="", flush=True)
        time.sleep(120)
        """
    )


def started_then_orphaned(child: str) -> tuple[int, str]:
    """Run ``child`` under a parent, kill the parent with SIGKILL once the child watches;
    return the child's PID and first line."""
    with subprocess.Popen(
        [sys.executable, "-c", parent_of(child)], stdout=subprocess.PIPE, text=True
    ) as parent:
        try:
            assert parent.stdout is not None
            pid, line = parent.stdout.readline().split()
            assert running(int(pid))  # watching, its parent alive
        finally:
            parent.kill()
    return int(pid), line


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_instance_stops_when_the_process_that_started_it_is_killed() -> None:
    child, line = started_then_orphaned(CHILD)
    assert line == "watching"
    wait_until(lambda: not running(child), lambda: f"process {child} still runs", timeout=10)


def test_an_instance_started_otherwise_watches_nothing() -> None:
    environment = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    code = "import threading; from foldstream.process import exit_with_parent; "
    code += "exit_with_parent(); print(threading.active_count())"
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=True
    )
    assert child.stdout.strip() == "1"  # the main thread alone


def test_an_instance_stuck_on_sigterm_is_killed_with_its_processes() -> None:
    # After the grace period the instance's whole process group is killed.
    child, line = started_then_orphaned(STUCK_CHILD)
    worker = int(line)
    assert running(worker)
    wait_until(
        lambda: not running(child) and not running(worker),
        lambda: f"child {child} running: {running(child)}, its worker {worker}: {running(worker)}",
        timeout=10,
    )


# Stands for a test run or `foldstream demo` with its embedded broker; prints the broker's PID.
BROKER_OWNER = textwrap.dedent(
    """
    import time
    from foldstream.broker import KafkaCluster
    broker = KafkaCluster().start()
    print(broker.pid, flush=True)
    time.sleep(120)
    """
)


def test_an_embedded_broker_stops_when_the_process_that_started_it_is_killed() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", BROKER_OWNER], stdout=subprocess.PIPE, text=True
    ) as owner:
        try:
            assert owner.stdout is not None
            broker = int(owner.stdout.readline())
            assert running(broker)
        finally:
            owner.kill()
    try:
        wait_until(lambda: not running(broker), lambda: f"broker {broker} still runs", timeout=10)
    finally:
        if running(broker):  # the test failed: leave no broker behind
            os.kill(broker, signal.SIGKILL)
