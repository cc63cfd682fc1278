"""Headless Chromium (Debian's package) driven over the Chrome DevTools protocol, for tests.

``scripts/ensure-chromium.sh`` installs Chromium when it is missing (the tests that need a
browser must not be skipped on a fresh machine) and prints its path. :class:`Browser` starts it
with a fresh profile on a loopback debugging port; :class:`Page` navigates, evaluates
JavaScript, waits for conditions, records every request the page made and every error it
reported, and takes screenshots.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_fixed
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[1]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--window-size=1400,1000",
]


def chromium_path() -> str:
    """Chromium's path, installed first if missing; fails loudly when it cannot be."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "ensure-chromium.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"Chromium is needed and could not be installed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


class Browser:
    """A headless Chromium process with a profile of its own; :meth:`close` stops it."""

    def __init__(self, path: str | None = None, timeout: float = 60.0) -> None:
        self._profile = tempfile.mkdtemp(prefix="foldstream-chromium-")
        profile = Path(self._profile)
        self.process = subprocess.Popen(
            [path or chromium_path(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # A session of its own, so that close() can stop Chromium's helper processes too:
            # they outlive the main one for a moment and write into the profile meanwhile.
            start_new_session=True,
        )
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not active.exists() or len(active.read_text().split()) < 2:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not open its debugging port")
            time.sleep(0.1)
        port, path_ = active.read_text().split()[:2]
        self._stack = contextlib.ExitStack()
        self.socket = self._stack.enter_context(
            connect(f"ws://127.0.0.1:{port}{path_}", max_size=64 * 2**20)
        )
        self._ids = itertools.count(1)

    def new_page(self) -> Page:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Network", "Log"):
            page.call(f"{domain}.enable")
        return page

    def call(self, method: str, session: str | None = None, **params: Any) -> Any:
        message: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self.socket.send(json.dumps(message))
        while True:
            reply = json.loads(self.socket.recv(timeout=60))
            if reply.get("id") == message["id"]:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            Page.events.append(reply)

    def close(self) -> None:
        if hasattr(self, "_stack"):
            self._stack.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        _remove_profile(self._profile)


@retry(
    retry=retry_if_exception_type(OSError),
    stop=stop_after_delay(10),
    wait=wait_fixed(0.2),
    reraise=True,
)
def _remove_profile(path: str) -> None:
    # A killed helper may be reaped a moment after the signal; until then it can still create
    # files, and rmtree then meets a directory that is not empty.
    if os.path.exists(path):
        shutil.rmtree(path)


class Page:
    """One tab. ``events`` keeps every protocol event received (of every page)."""

    events: list[dict[str, Any]] = []

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def call(self, method: str, **params: Any) -> Any:
        return self.browser.call(method, self.session, **params)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """The first truthy value of ``expression``, evaluated until ``timeout``."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:  # e.g. the page is still loading
                value = exc
            if value and not isinstance(value, Exception):
                return value
            time.sleep(0.2)
        raise AssertionError(f"{expression} still {value!r} after {timeout}s")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))

    def requested(self) -> list[str]:
        """Every URL the pages asked for so far."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def errors(self) -> list[Any]:
        """Uncaught exceptions, console errors and failed loads the pages reported."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"])
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(params.get("args"))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"])
        return found
