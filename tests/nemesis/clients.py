"""Clients that keep sending commands and reads to random instances while the nemesis works,
recording every operation (:class:`~tests.nemesis.history.Op`).

A command is ``receive_shipment`` of the inventory example with a quantity no other command
has: its event names the command that appended it, so the checker can tell which
acknowledged command each event belongs to, and a stock value (a sum of unique quantities)
names the prefix of the product's events it folds. Redirects are followed by hand (each hop
recorded); an answer that never came (refused, reset, timed out) leaves the outcome unknown.
With ``retry_commands``, a command without a definite answer is sent again with the same
``Idempotency-Key`` until one comes (or ``MAX_ATTEMPTS``, or ``RETRY_DEADLINE_S``), even after
the load was told to stop: its outcome must become known. Every operation is recorded when it
starts, so one whose client never finished shows without an answer.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.nemesis.history import Clock, Hop, Op

MAX_HOPS = 4
MAX_ATTEMPTS = 100
#: How long a command is resent for at most, and how long between two attempts.
RETRY_DEADLINE_S = 120.0
RETRY_WAIT_S = 0.5
REQUEST_TIMEOUT_S = 5.0
#: How long :meth:`Load.stop` waits for a client's last operation: its retries, each attempt
#: up to its hops' timeouts.
STOP_WAIT_S = RETRY_DEADLINE_S + 2 * MAX_HOPS * REQUEST_TIMEOUT_S
STORE = "stock"


@dataclass
class Load:
    """``clients`` threads sending operations to ``urls`` until :meth:`stop`."""

    urls: list[str]
    clock: Clock
    seed: int
    clients: int = 4
    keys: int = 24
    pause_s: float = 0.02  # between a client's operations: leaves the cores to the instances
    retry_commands: bool = False
    ops: list[Op] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for n in range(self.clients):
            thread = threading.Thread(target=self._run, args=(n,), name=f"client-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[Op]:
        self._stop.set()
        for thread in self._threads:
            thread.join(STOP_WAIT_S)
        with self._lock:
            return sorted(self.ops, key=lambda op: op.id)

    def _run(self, client: int) -> None:
        rng = random.Random(self.seed * 1000 + client)
        tokens: dict[str, tuple[str, int]] = {}  # key -> (token, version) of the last command
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, follow_redirects=False) as http:
            while not self._stop.is_set():
                key = f"n{self.seed}-{rng.randrange(self.keys)}"
                op = Op(id=next(self._ids), client=client, kind="command", key=key, start=0.0)
                op.kind = "command" if rng.random() < 0.5 else "read"
                with self._lock:
                    self.ops.append(op)
                if op.kind == "command":
                    self._command(http, rng, op, tokens)
                else:
                    self._read(http, rng, op, tokens.get(key))
                self._stop.wait(rng.uniform(0, 2 * self.pause_s))

    def _command(
        self, http: httpx.Client, rng: random.Random, op: Op, tokens: dict[str, tuple[str, int]]
    ) -> None:
        op.quantity = op.id
        op.idempotency_key = uuid.uuid4().hex
        op.start = self.clock.now()
        path = f"/commands/product/{op.key}/receive_shipment"
        deadline = time.monotonic() + RETRY_DEADLINE_S
        while op.attempts < (MAX_ATTEMPTS if self.retry_commands else 1):
            op.attempts += 1
            answer = self._send(
                http,
                rng,
                op,
                "POST",
                path,
                json={"quantity": op.quantity},
                headers={"Idempotency-Key": op.idempotency_key},
            )
            if op.status not in (None, 503) or time.monotonic() > deadline:
                break
            time.sleep(RETRY_WAIT_S)  # not the stop event: the command goes on to its answer
        op.end = self.clock.now()
        if op.status == 200 and isinstance(answer, dict):
            op.token = answer.get("token")
            op.position = (answer["position"]["partition"], answer["position"]["offset"])
            op.version = answer["events"][-1]["version"]
            tokens[op.key] = (str(op.token), op.version)

    def _read(
        self, http: httpx.Client, rng: random.Random, op: Op, token: tuple[str, int] | None
    ) -> None:
        params: dict[str, str] = {}
        if token is not None and rng.random() < 0.5:
            op.token, op.token_version = token
            params["consistent_with"] = op.token
        if rng.random() < 0.4:
            op.max_lag = rng.choice((0, 5, 100))
            params["max_lag"] = str(op.max_lag)
        op.start = self.clock.now()
        answer = self._send(http, rng, op, "GET", f"/stores/{STORE}/keys/{op.key}", params=params)
        op.end = self.clock.now()
        if op.status == 200 and isinstance(answer, dict):
            op.value = answer.get("value")
            op.served_by = answer.get("served_by")

    def _send(
        self, http: httpx.Client, rng: random.Random, op: Op, method: str, path: str, **kw: Any
    ) -> Any:
        """One attempt: to a random instance, following redirects; sets ``op.status``."""
        url = rng.choice(self.urls) + path
        op.status = None
        for _ in range(MAX_HOPS):
            try:
                response = http.request(method, url, **kw)
            except httpx.HTTPError as exc:
                op.hops.append(Hop(url, self.clock.now(), None, error=type(exc).__name__))
                op.status = None  # whatever an earlier hop answered, this one did not
                return None
            hop = Hop(url, self.clock.now(), response.status_code)
            op.hops.append(hop)
            op.status = response.status_code
            op.answered_by = str(httpx.URL(url).copy_with(path="/", query=None))[:-1]
            if response.status_code == 307:
                hop.location = response.headers.get("location")
                url = hop.location or url
                kw.pop("params", None)  # the location carries the query
                continue
            hop.retry_after = response.headers.get("retry-after")
            try:
                return response.json()
            except ValueError:
                return None
        return None
