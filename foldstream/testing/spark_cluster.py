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
(:func:`executor_lost`, :func:`tasks_lost`).

Started from the main thread, the master and workers die with the process that started them,
even by ``kill -9`` (``setpriv --pdeathsig``, as the embedded broker); a worker's executors
exit once their worker is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from foldstream.broker import free_port
from foldstream.errors import EnvironmentNotReady, FoldstreamError
from foldstream.process import http
from foldstream.spark import JVM_OPTIONS

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
#: Warnings only, but the standalone deploy's notes (executors added, lost), each executor's
#: task log and the driver's (tasks started, finished, lost with their executor; executors
#: lost): what ran where.
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = info
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = info
logger.dag.name = org.apache.spark.scheduler.DAGScheduler
logger.dag.level = info
"""
_TASK = r"task (\d+)\.(\d+) in stage (\d+)\.\d+ \(TID (\d+)\)"
_RUNNING = re.compile(rf"Running {_TASK}")
_LOST = re.compile(rf"{_TASK} failed because while it was being computed, its executor exited")


@dataclass(frozen=True)
class TaskAttempt:
    """One attempt of a Spark task (``task <index>.<attempt> in stage <stage>.<n> (TID
    <tid>)`` in Spark's logs)."""

    stage: int
    index: int
    attempt: int
    tid: int


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


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """The processes descended from ``pid`` (children, their children...), alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def _started(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the PID, it names one process even
    after the PID is reused."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def _cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` alone, in clock ticks (0 once it is gone)."""
    fields = _stat(pid)
    return 0 if fields is None else int(fields[11]) + int(fields[12])


def _command(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _attempts(found: list[tuple[str, str, str, str]]) -> list[TaskAttempt]:
    return [
        TaskAttempt(stage=int(stage), index=int(index), attempt=int(attempt), tid=int(tid))
        for index, attempt, stage, tid in found
    ]


def task_attempts_in(executor_log: str) -> list[TaskAttempt]:
    """Every task attempt an executor's log says it started."""
    return _attempts(_RUNNING.findall(executor_log))


def executor_lost(driver_log: str, executor_id: str) -> bool:
    """Whether the driver's log says it handled the loss of executor ``executor_id``: its
    scheduler has failed the tasks the executor was running by then (:func:`tasks_lost`)."""
    return f"Executor lost: {executor_id} (epoch" in driver_log


def tasks_lost(driver_log: str) -> list[TaskAttempt]:
    """The task attempts the driver's log says failed because their executor was lost while
    running them (Spark runs them again, and does not count the failure)."""
    return _attempts(_LOST.findall(driver_log))


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
        except OSError:
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
        return [a for log in self.executor_logs(worker) for a in task_attempts_in(_read(log))]

    def python_cpu_ticks(self, worker: SparkDaemon) -> int:
        """CPU clock ticks used by the Python processes alive under ``worker`` (its executors'
        Python daemon and workers)."""
        if worker.pid is None:
            return 0
        pythons = (p for p in descendants(worker.pid) if "python" in Path(_command(p)[0]).name)
        return sum(_cpu_ticks(p) for p in pythons)

    def busy_worker(
        self, timeout: float = 120.0, poll_s: float = 0.01, samples: int = 2
    ) -> SparkDaemon:
        """The first running worker whose Python used CPU in ``samples`` polls in a row: one
        whose executor is running a Python task (Spark's Python workers wait between tasks
        without using any)."""
        running = [w for w in self.workers if w.alive()]
        last = {w.name: self.python_cpu_ticks(w) for w in running}
        busy = dict.fromkeys(last, 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(poll_s)
            for worker in running:
                used = self.python_cpu_ticks(worker)
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
            _signal_all(found, signal.SIGSTOP)
            stopped += found
            found = [p for p in descendants(root) if p not in stopped]
        executors = [
            command[command.index("--executor-id") + 1]
            for command in map(_command, stopped)
            if "--executor-id" in command
        ]
        _signal_all(stopped, signal.SIGKILL)
        worker.process.wait()
        return KilledWorker(worker.name, stopped, executors)

    def stop(self) -> None:
        """Stop every worker (SIGTERM: it stops its executors), then the master; kill what is
        left of their process trees after a grace period."""
        for daemon in [*self.workers, self.master]:
            process, daemon.process = daemon.process, None
            if process is None:
                continue
            tree = {p: _started(p) for p in [process.pid, *descendants(process.pid)]}
            if process.poll() is None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(30)
            _signal_all([p for p, t in tree.items() if t and _started(p) == t], signal.SIGKILL)
            process.wait()

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
