"""An instance run as a child process (``foldstream serve``): for the demo, tests and benches.

Only processes started here are ever signalled, by their own PID. An instance started here
stops when the process that started it is gone, even by ``kill -9`` (:func:`exit_with_parent`):
a killed test run or bench leaves no instance behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from foldstream.broker import free_port
from foldstream.errors import FoldstreamError

log = logging.getLogger(__name__)

#: Set by :class:`InstanceProcess` in the instance's environment: the PID of the process that
#: started it (see :func:`exit_with_parent`).
PARENT_PID_ENV = "FOLDSTREAM_PARENT_PID"


def exit_with_parent(*, poll_s: float = 0.5, grace_s: float = 30.0) -> None:
    """In an instance an :class:`InstanceProcess` started (:data:`PARENT_PID_ENV` set): once
    that process is gone, stop as on ``SIGTERM``, and if still running ``grace_s`` later, kill
    the instance's process group (its own session: the JVM and Spark's workers with it).

    A background thread polls the parent PID: the kernel's parent-death signal would follow the
    *thread* that started the instance, which need not live as long as its process.
    """
    expected = os.environ.get(PARENT_PID_ENV)
    if not expected:
        return
    parent = int(expected)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("the process that started this instance (%d) is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        if os.getpgid(0) == os.getpid():  # leads its own group: nothing else is in it
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx comes back as an HTTPError, handled in http()


_opener = urllib.request.build_opener(_NoRedirects)


def http(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = 30.0,
    *,
    follow_redirects: bool = True,
) -> tuple[int, Any]:
    """A JSON request with the standard library; returns (status, decoded body).

    ``body`` is sent as JSON, or as it is when it is already ``bytes``. A 307 is followed with
    the same method and body (up to 5 times) unless ``follow_redirects`` is false; then the
    answer is ``(307, {"location": <url>})``.
    """
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    for _ in range(6):
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with _opener.open(request, timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            if exc.code == 307:
                location = exc.headers["Location"]
                if not follow_redirects:
                    return 307, {"location": location}
                url = location
                continue
            try:
                return exc.code, json.loads(payload or b"null")
            except ValueError:
                return exc.code, payload.decode(errors="replace")
    raise FoldstreamError(f"more than 5 redirects from {url}")


def lookup(base_url: str, store: str, key: str) -> tuple[int, Any]:
    """``GET /stores/{store}/keys/{key}`` following redirects, without the ``served_by`` part
    (which instance answered), for comparing answers with expected values."""
    status, body = http("GET", f"{base_url}/stores/{store}/keys/{urllib.parse.quote(key, safe='')}")
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k != "served_by"}
    return status, body


class InstanceProcess:
    """``foldstream serve`` in a child process on a free loopback port."""

    def __init__(
        self,
        *,
        bootstrap: str,
        state_dir: Path,
        service: str = "foldstream.examples.inventory:service",
        partitions: int = 6,
        port: int | None = None,
        log_path: Path | None = None,
        spark_master: str = "local[2]",
        standbys: int = 1,
        session_timeout_ms: int = 3000,
        server: str = "uvicorn",
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
        launcher: Sequence[str] = (),
    ) -> None:
        """``env``: more environment variables for the instance (e.g. ``KAFKA_*`` client
        properties); ``args``: more ``foldstream serve`` arguments; ``host``: the address it
        serves on, ``launcher``: what its command runs under (``ip netns exec NAME``: a host of
        its own)."""
        self.bootstrap = bootstrap
        self.state_dir = Path(state_dir)
        self.service = service
        self.partitions = partitions
        self.port = port or free_port()
        self.log_path = log_path or self.state_dir.with_name(
            self.state_dir.name + f"-{self.port}.log"
        )
        self.spark_master = spark_master
        self.standbys = standbys
        self.session_timeout_ms = session_timeout_ms
        self.server = server
        self.env = dict(env or {})
        self.args = list(args)
        self.host = host
        self.launcher = list(launcher)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> InstanceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **self.env,
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            PARENT_PID_ENV: str(os.getpid()),
        }
        with open(self.log_path, "ab") as log:  # the child keeps its own copy
            self.process = self._spawn(log, env)
        return self

    def _spawn(self, log: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                *self.launcher,
                sys.executable,
                "-m",
                "foldstream",
                "serve",
                "--service",
                self.service,
                *(["--host", self.host] if self.host != "127.0.0.1" else []),
                "--port",
                str(self.port),
                "--state-dir",
                str(self.state_dir),
                "--partitions",
                str(self.partitions),
                "--spark-master",
                self.spark_master,
                "--standbys",
                str(self.standbys),
                "--session-timeout-ms",
                str(self.session_timeout_ms),
                "--server",
                self.server,
                *self.args,
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its JVM and Python workers share its process group
        )

    def wait_ready(self, timeout: float = 180.0) -> dict[str, Any]:
        """Wait until ``GET /ready`` says 200; raise with the log's tail if it never does."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise FoldstreamError(f"instance exited early; log tail:\n{self.log_tail()}")
            try:
                status, last = http("GET", f"{self.url}/ready", timeout=5)
                if status == 200:
                    return last  # type: ignore[no-any-return]
            except OSError:
                pass
            time.sleep(0.2)
        raise FoldstreamError(
            f"instance not ready after {timeout}s ({last}); log tail:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the whole process group: the instance, its JVM and Spark's Python workers."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM and wait (uvicorn shuts the lifespan down); SIGKILL if it takes too long."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        if self.process.poll() is None or _group_alive(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> InstanceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def cluster_unsettled(instances: Sequence[InstanceProcess], *, standbys: bool = True) -> str | None:
    """Why the cluster is not stable yet, or None once every instance is ready and sees exactly
    these members, every partition served by the owner the assignment names (no move pending)
    and, with ``standbys``, a caught-up standby copy of each."""
    urls = {i.url for i in instances}
    for instance in instances:
        status, ready = http("GET", f"{instance.url}/ready", timeout=5)
        if status != 200:
            return f"{instance.url} not ready: {ready}"
        status, view = http("GET", f"{instance.url}/cluster", timeout=5)
        if status != 200:
            return f"{instance.url}/cluster answered {status}: {view}"
        members = {m["url"] for m in view["instances"]}
        if members != urls:
            return f"{instance.url} sees members {sorted(members)}"
        if not view["settled"]:
            return f"{instance.url}: assignment generation {view['generation']} not settled"
        for topic, partitions in view["partitions"].items():
            for p, entry in partitions.items():
                if entry["active"] not in urls:
                    return f"{instance.url}: {topic}/{p} has no live owner"
                if standbys and not _caught_up_standby(view, entry, p):
                    return (
                        f"{instance.url}: {topic}/{p} has no caught-up standby: {entry} (the "
                        f"lags members publish: {_published_lags(view, p)})"
                    )
    return None


def _caught_up_standby(view: dict[str, Any], entry: dict[str, Any], partition: str) -> bool:
    """Whether a standby of ``partition`` has applied its whole changelog, as its member
    publishes it: ready for a takeover. (The lag a route gives a standby counts its owner's
    too, which is what a read's ``max_lag`` is held to, not whether the copy is complete.)"""
    lags = _published_lags(view, partition)
    return any(lags.get(s["url"]) and not any(lags[s["url"]].values()) for s in entry["standbys"])


def _published_lags(view: dict[str, Any], partition: str) -> dict[str, dict[str, int]]:
    """Each member's published lag of ``partition``'s copies (a standby's lag counts its
    owner's)."""
    suffix = f"/{partition}"
    return {
        m["url"]: {k: v for k, v in (m.get("lag") or {}).items() if k.endswith(suffix)}
        for m in view["instances"]
    }


def cluster_stable(instances: Sequence[InstanceProcess], *, standbys: bool = True) -> bool:
    """Whether :func:`cluster_unsettled` finds nothing left to settle."""
    return cluster_unsettled(instances, standbys=standbys) is None


def wait_cluster_stable(
    instances: Sequence[InstanceProcess], *, standbys: bool = True, timeout: float = 120.0
) -> None:
    """Wait until :func:`cluster_stable`; raise saying what was still unsettled if it never is."""
    deadline = time.monotonic() + timeout
    reason: str | None = "not asked yet"
    while time.monotonic() < deadline:
        try:
            reason = cluster_unsettled(instances, standbys=standbys)
        except OSError as exc:
            reason = repr(exc)
        if reason is None:
            return
        time.sleep(0.1)
    raise FoldstreamError(f"cluster not stable after {timeout}s: {reason}")
