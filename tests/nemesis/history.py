"""What a nemesis run records: every operation a client sent, with its start, end and answer,
and every fault the nemesis injected, all on one clock (seconds since the run started)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal


class Clock:
    """Seconds since the run started (monotonic)."""

    def __init__(self) -> None:
        self._zero = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._zero


@dataclass
class Hop:
    """One HTTP request of an operation: where it went, when it ended, what came back."""

    url: str
    end: float
    status: int | None  # None: no answer (refused, reset, timed out)
    location: str | None = None  # of a 307
    retry_after: str | None = None  # of a 503
    error: str | None = None


@dataclass
class Op:
    """One operation: a command (with the unique ``quantity`` that identifies its event) or a
    read of a key, from its first request to its last answer."""

    id: int
    client: int
    kind: Literal["command", "read"]
    key: str
    start: float
    end: float = 0.0
    hops: list[Hop] = field(default_factory=list)
    status: int | None = None  # the last answer's; None when the outcome is unknown
    quantity: int | None = None  # a command's: unique to it
    idempotency_key: str | None = None
    attempts: int = 0
    token: str | None = None  # a command's answer, or the read's consistent_with
    token_version: int | None = None  # the version of the command the read's token names
    position: tuple[int, int] | None = None  # a command's answer: (partition, offset)
    version: int | None = None  # a command's answer: its last event's version
    max_lag: int | None = None  # a read's
    value: Any = None  # a read's answer: the stored value (None: no such key)
    served_by: dict[str, Any] | None = None
    answered_by: str | None = None  # the URL of the instance whose answer ended it


@dataclass
class Fault:
    """A fault injected or repaired, e.g. ``("kill", "instance 2")``."""

    at: float
    action: str
    target: str
    detail: str = ""


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)  # instance n's URL at index n
    #: Whether the clients resent each command (with its key) until a definite answer came.
    commands_retried: bool = False

    def write(self, path: Path) -> None:
        with path.open("w") as out:
            out.write(
                json.dumps({"urls": self.urls, "commands_retried": self.commands_retried}) + "\n"
            )
            for fault in self.faults:
                out.write(json.dumps({"fault": asdict(fault)}) + "\n")
            for op in self.ops:
                out.write(json.dumps({"op": asdict(op)}) + "\n")
