"""A Spark standalone cluster on this machine, for tests and benchmarks: a master and workers
started from the pyspark installation (``bin/spark-class``), each a JVM of its own, on
127.0.0.1 only::

    with SparkStandaloneCluster(root=tmp_path, workers=2) as spark:
        instance = InstanceProcess(..., spark_master=spark.master_url, env=spark.driver_env)
        worker = spark.busy_worker()            # one whose executor runs a Python task now
        killed = spark.kill_worker(worker)      # kill -9 of the worker, its executor, its Python

An application's executors on a worker are JVMs the worker starts, and their Python workers
are forked by Spark's Python daemon, which makes itself a process group of its own. So a
worker is killed by its process *tree*: every process descended from the worker JVM is
stopped first (none can fork or lose its parent meanwhile), then all are killed. Only
processes started here, and their descendants, are ever signalled.

The cluster's ``SPARK_CONF_DIR`` holds the settings a driver joining it takes
(:attr:`~SparkStandaloneCluster.driver_env`, or :attr:`~SparkStandaloneCluster.session_conf`
for a session made in this process): loopback addresses, the executors' memory and JVM options.
Its logging keeps the executors' task log (``Running task 0.1 in stage 2.0 (TID 3)``), which
says what each executor ran (:meth:`~SparkStandaloneCluster.task_attempts`), and the driver's
scheduler notes on tasks and executors: whether a killed executor was running a task
(:mod:`~foldstream.testing.spark_logs`).

Started from the main thread, the master and workers die with the process that started them,
even by ``kill -9`` (``setpriv --pdeathsig``, as the embedded broker); a worker's executors
exit once their worker is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from foldstream.broker import free_port
from foldstream.errors import EnvironmentNotReady, FoldstreamError
from foldstream.process import http
from foldstream.spark import JVM_OPTIONS
from foldstream.testing.proc_tree import (
    command_line,
    cpu_ticks,
    descendants,
    proc_stat,
    signal_all,
    started_at,
)
from foldstream.testing.spark_logs import LOG4J2, TaskAttempt, read_log, task_attempts_in

#: Settings of a driver (an instance, a bench) using the cluster: its executors run tasks whose
#: records stay in Python, as a local master's JVM does (:data:`~foldstream.spark.JVM_OPTIONS`),
#: and every address is loopback.
SESSION_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.memory": "512m",
    "spark.executor.extraJavaOptions": JVM_OPTIONS,
}
#: The master's and workers' own JVMs: they only schedule and start executors.
DAEMON_ENV = {
    "SPARK_DAEMON_MEMORY": "256m",
    "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xms32m",
    "SPARK_LOCAL_IP": "127.0.0.1",  # the web UIs bind it too
}


class KilledWorker(NamedTuple):
    """A worker :meth:`SparkStandaloneCluster.kill_worker` killed: the PIDs of its process tree
    and the ids of the executors it ran."""

    name: str
    pids: list[int]
    executors: list[str]


def spark_home() -> Path:
    """The Spark distribution inside the pyspark package (``bin/spark-class``, ``jars/``)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise EnvironmentNotReady(
            f"{home} has no bin/spark-class: install pyspark from PyPI (pip install pyspark), "
            "whose package carries Spark's scripts and jars"
        )
    return home


@dataclass
class SparkDaemon:
    """A master or worker JVM started here: its ports, log and process."""

    name: str
    port: int
    webui_port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class SparkStandaloneCluster:
    """A standalone master and ``workers`` workers (``cores`` and ``memory`` each) on
    127.0.0.1, on free ports, with their configuration, work directories (the executors' logs)
    and logs under ``root``.

    :meth:`start` returns once every worker registered with the master; :meth:`stop` stops
    them all (their executors with them). :attr:`master_url` is what ``--spark-master``
    takes. A worker's ``memory`` must hold an executor's (512m, :data:`SESSION_CONF`), or the
    master starts none there.
    """

    def __init__(self, *, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.root = Path(root)
        self.cores = cores
        self.memory = memory
        self.home = spark_home()
        self.conf_dir = self.root / "conf"
        self.master = SparkDaemon("master", free_port(), free_port(), self.root / "master.log")
        self.workers = [
            SparkDaemon(f"worker-{n}", free_port(), free_port(), self.root / f"worker-{n}.log")
            for n in range(1, workers + 1)
        ]

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master.port}"

    @property
    def session_conf(self) -> dict[str, str]:
        """Settings of a session this process makes on the cluster (``spark_session(conf=)``)."""
        return dict(SESSION_CONF)

    @property
    def driver_env(self) -> dict[str, str]:
        """The environment of a process whose driver joins the cluster (an instance): the
        cluster's ``SPARK_CONF_DIR``, whose ``spark-defaults.conf`` holds :data:`SESSION_CONF`."""
        return {"SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOCAL_IP": "127.0.0.1"}

    def work_dir(self, worker: SparkDaemon) -> Path:
        return self.root / worker.name

    def start(self, timeout: float = 120.0) -> SparkStandaloneCluster:
        """Start the master and every worker; wait until all workers are registered."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "log4j2.properties").write_text(LOG4J2)
        (self.conf_dir / "spark-defaults.conf").write_text(
            "".join(f"{key} {value}\n" for key, value in SESSION_CONF.items())
        )
        try:
            self._spawn(self.master, "org.apache.spark.deploy.master.Master", [])
            self._await(lambda: self.status() is not None, "answer from the master", timeout)
            self.ensure_workers(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def ensure_workers(self, timeout: float = 120.0) -> None:
        """Start again every worker that is not running (killed by a test), and wait until
        each is registered with the master and alive."""
        for worker in self.workers:
            if not worker.alive():
                arguments = ["--cores", str(self.cores), "--memory", self.memory]
                arguments += ["--work-dir", str(self.work_dir(worker)), self.master_url]
                self._spawn(worker, "org.apache.spark.deploy.worker.Worker", arguments)
        self._await(
            lambda: not self.unregistered_workers(),
            "registration of every worker",
            timeout,
            lambda: f"(not registered: {self.unregistered_workers()})",
        )

    def unregistered_workers(self) -> list[str]:
        """This cluster's running workers that the master does not list alive, by name."""
        status = self.status() or {}
        alive = {w.get("port") for w in status.get("workers", []) if w.get("state") == "ALIVE"}
        return [w.name for w in self.workers if w.alive() and w.port not in alive]

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), or None while it does not answer."""
        try:
            code, body = http("GET", f"http://127.0.0.1:{self.master.webui_port}/json/", timeout=5)
        except (OSError, ValueError):  # not up yet, or its UI not yet serving the JSON
            return None
        return body if code == 200 and isinstance(body, dict) else None

    def _spawn(self, daemon: SparkDaemon, main_class: str, arguments: list[str]) -> None:
        command = [str(self.home / "bin" / "spark-class"), main_class, "--host", "127.0.0.1"]
        command += ["--port", str(daemon.port), "--webui-port", str(daemon.webui_port)]
        command += arguments
        setpriv = shutil.which("setpriv")
        # As the embedded broker's: the parent-death signal follows the starting thread.
        if setpriv and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        env = {**os.environ, **DAEMON_ENV, "SPARK_HOME": str(self.home)}
        env["SPARK_CONF_DIR"] = str(self.conf_dir)
        with open(daemon.log_path, "ab") as log:  # the child keeps its own copy
            daemon.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def _await(
        self,
        done: Callable[[], bool],
        what: str,
        timeout: float,
        describe: Callable[[], str] = str,
    ) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            for daemon in [self.master, *self.workers]:
                if daemon.process is not None and daemon.process.poll() is not None:
                    raise FoldstreamError(
                        f"spark {daemon.name} exited with {daemon.process.returncode}; "
                        f"log tail:\n{daemon.log_tail()}"
                    )
            if time.monotonic() > deadline:
                raise FoldstreamError(
                    f"no {what} after {timeout}s {describe()}; master log tail:\n"
                    f"{self.master.log_tail()}"
                )
            time.sleep(0.1)

    def executor_logs(self, worker: SparkDaemon) -> list[Path]:
        """The logs (stderr) of every executor ``worker`` started since the cluster started."""
        return sorted(self.work_dir(worker).glob("app-*/*/stderr"))

    def task_attempts(self, worker: SparkDaemon) -> list[TaskAttempt]:
        """Every task attempt the executors of ``worker`` started."""
        return [a for log in self.executor_logs(worker) for a in task_attempts_in(read_log(log))]

    def python_workers(self, worker: SparkDaemon) -> list[int]:
        """The Python workers alive under ``worker`` that Spark's Python daemon forked (its
        executors' task workers; the daemon itself is not among them)."""
        if worker.pid is None:
            return []
        pythons = {p for p in descendants(worker.pid) if "python" in Path(command_line(p)[0]).name}
        return [
            p for p in pythons if (fields := proc_stat(p)) is not None and int(fields[1]) in pythons
        ]

    def pythoncpu_ticks(self, worker: SparkDaemon) -> int:
        """CPU clock ticks used by :meth:`python_workers` of ``worker``."""
        return sum(cpu_ticks(p) for p in self.python_workers(worker))

    def busy_worker(
        self, timeout: float = 120.0, poll_s: float = 0.01, samples: int = 2
    ) -> SparkDaemon:
        """The first running worker whose Python workers used CPU in ``samples`` polls in a
        row: one whose executor is running a Python task (Spark's Python workers wait between
        tasks without using any). Workers start theirs with their executor's first Python task:
        wait until each has some (:meth:`python_workers`) to tell tasks from their start."""
        running = [w for w in self.workers if w.alive()]
        last = {w.name: self.pythoncpu_ticks(w) for w in running}
        busy = dict.fromkeys(last, 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(poll_s)
            for worker in running:
                used = self.pythoncpu_ticks(worker)
                busy[worker.name] = busy[worker.name] + 1 if used > last[worker.name] else 0
                last[worker.name] = used
                if busy[worker.name] >= samples:
                    return worker
        raise FoldstreamError(f"no worker ran Python code within {timeout}s")

    def kill_worker(self, worker: SparkDaemon) -> KilledWorker:
        """``kill -9`` of ``worker`` and every process under it (its executors' JVMs, their
        Python daemon and workers).

        Each is stopped (SIGSTOP) first, until no new one appears, so none forks, exits or
        loses its parent between finding and killing them; then all are killed at once.
        """
        if worker.process is None:
            return KilledWorker(worker.name, [], [])
        root = worker.process.pid
        stopped: list[int] = []
        found = [root]
        while found:
            signal_all(found, signal.SIGSTOP)
            stopped += found
            found = [p for p in descendants(root) if p not in stopped]
        executors = [
            command[command.index("--executor-id") + 1]
            for command in map(command_line, stopped)
            if "--executor-id" in command
        ]
        signal_all(stopped, signal.SIGKILL)
        worker.process.wait()
        return KilledWorker(worker.name, stopped, executors)

    def stop(self) -> None:
        """Stop every worker (SIGTERM: it stops its executors), then the master; kill what is
        left of their process trees after a grace period."""
        for daemon in [*self.workers, self.master]:
            process, daemon.process = daemon.process, None
            if process is None:
                continue
            tree = {p: started_at(p) for p in [process.pid, *descendants(process.pid)]}
            if process.poll() is None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(30)
            signal_all([p for p, t in tree.items() if t and started_at(p) == t], signal.SIGKILL)
            process.wait()

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
