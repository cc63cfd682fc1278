"""Checks a nemesis run's history against the events topic for every guarantee
``docs/concepts/guarantees.md`` states; each check names the guarantee it verifies.

The events topic is read after the run, committed records only, once the cluster settled: it is
the truth every answer is held against.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.nemesis.history import History, Op

#: How old the lag a copy reports may be when a read is answered (the copies' lag is measured
#: every upkeep round, 0.5 s, and published with the next one): a read allowing ``max_lag``
#: records is held against the partition's end as it stood this long before it started.
LAG_SLACK_S = 1.5
#: How long after it dies a member may still be redirected to: until its silence passes the
#: suspect threshold (``suspect_after_ms``) and the next read of the cluster topic notices it.
SUSPECT_SLACK_S = 1.5
#: Statuses that say a command was not applied.
REFUSED = frozenset({400, 404, 409, 413, 422, 503})


@dataclass(frozen=True)
class Event:
    partition: int
    offset: int
    key: str
    version: int
    quantity: int | None  # a ShipmentReceived's


@dataclass
class Verdict:
    """How many operations each guarantee was checked on, and what broke it."""

    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def count(self, guarantee: str, n: int = 1) -> None:
        self.checked[guarantee] += n

    def fail(self, guarantee: str, detail: str) -> None:
        self.violations[guarantee].append(detail)

    @property
    def total_violations(self) -> int:
        return sum(len(v) for v in self.violations.values())


def parse_event(
    partition: int, offset: int, key: bytes, value: bytes | None, headers: list[Any]
) -> Event:
    found = dict(headers)
    return Event(
        partition,
        offset,
        key.decode(),
        int(found["version"]),
        json.loads(value or b"{}").get("quantity")
        if b"ShipmentReceived" in found["event-type"]
        else None,
    )


def check(history: History, events: list[Event]) -> Verdict:
    verdict = Verdict()
    by_key: dict[str, list[Event]] = defaultdict(list)
    for event in sorted(events, key=lambda e: (e.partition, e.offset)):
        by_key[event.key].append(event)
    _versions(by_key, verdict)
    commands = [op for op in history.ops if op.kind == "command"]
    reads = [op for op in history.ops if op.kind == "read"]
    _commands_applied(commands, events, verdict)
    if history.commands_retried:
        _outcomes_known(commands, events, verdict)
    _append_order(commands, verdict)
    _reads(reads, commands, by_key, verdict)
    _redirects(history, verdict)
    _retry_after(history.ops, verdict)
    return verdict


def _versions(by_key: dict[str, list[Event]], verdict: Verdict) -> None:
    """Per aggregate, the versions in log order are 1, 2, 3...: no gap, no repeat."""
    for key, found in by_key.items():
        verdict.count("versions")
        versions = [e.version for e in found]
        if versions != list(range(1, len(versions) + 1)):
            verdict.fail("versions", f"{key}: versions in log order {versions[:50]}")


def _by_command(events: list[Event]) -> dict[tuple[str, int], list[Event]]:
    """The events of each command, by (key, quantity): a quantity names its command."""
    seen: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for event in events:
        if event.quantity is not None:
            seen[(event.key, event.quantity)].append(event)
    return seen


def _outcomes_known(commands: list[Op], events: list[Event], verdict: Verdict) -> None:
    """Commands resent with their Idempotency-Key until a definite answer came: every one has
    such an answer (not none, not a 503), and, the load's commands being valid, every one is
    in the log exactly once."""
    seen = _by_command(events)
    for op in commands:
        assert op.quantity is not None
        verdict.count("outcome-known")
        if op.status in (None, 503):
            verdict.fail(
                "outcome-known",
                f"op {op.id} ({op.key}): {op.status or 'no answer'} after {op.attempts} attempts",
            )
        verdict.count("applied-once")
        found = len(seen.get((op.key, op.quantity), []))
        if found != 1:
            verdict.fail("applied-once", f"op {op.id} ({op.key}) {op.status}: {found}x in the log")


def _commands_applied(commands: list[Op], events: list[Event], verdict: Verdict) -> None:
    """An acknowledged command's event is in the log once, where its answer said; a refused
    one's never; one without an answer at most once."""
    seen = _by_command(events)
    for op in commands:
        assert op.quantity is not None
        found = seen.get((op.key, op.quantity), [])
        if op.status == 200:
            verdict.count("acknowledged-once")
            where = [(e.partition, e.offset, e.version) for e in found]
            expected = (*op.position, op.version) if op.position else None
            if len(found) != 1 or where[0] != expected:
                verdict.fail(
                    "acknowledged-once", f"op {op.id} ({op.key}): answered {expected}, log {where}"
                )
        elif op.status in REFUSED:
            verdict.count("refused-never")
            if found:
                verdict.fail(
                    "refused-never",
                    f"op {op.id} ({op.key}) answered {op.status}, in the log {len(found)}x",
                )
        else:
            verdict.count("unknown-at-most-once")
            if len(found) > 1:
                verdict.fail(
                    "unknown-at-most-once", f"op {op.id} ({op.key}): in the log {len(found)}x"
                )


def _append_order(commands: list[Op], verdict: Verdict) -> None:
    """Per partition, a command acknowledged before another was sent lies before it in the log."""
    by_partition: dict[int, list[Op]] = defaultdict(list)
    for op in commands:
        if op.status == 200 and op.position is not None:
            by_partition[op.position[0]].append(op)
    for acknowledged in by_partition.values():
        acknowledged.sort(key=lambda op: op.start)
        verdict.count("append-order", len(acknowledged))
        latest_done: Op | None = None  # of the commands that ended before this one started
        ends = sorted(acknowledged, key=lambda op: op.end)
        i = 0
        for op in acknowledged:
            while i < len(ends) and ends[i].end < op.start:
                if latest_done is None or ends[i].position > latest_done.position:  # type: ignore[operator]
                    latest_done = ends[i]
                i += 1
            if latest_done is not None and latest_done.position >= op.position:  # type: ignore[operator]
                verdict.fail(
                    "append-order",
                    f"op {latest_done.id} ended before op {op.id} started, but lies at "
                    f"{latest_done.position} >= {op.position}",
                )


def _reads(
    reads: list[Op], commands: list[Op], by_key: dict[str, list[Event]], verdict: Verdict
) -> None:
    acknowledged = [op for op in commands if op.status == 200 and op.position is not None]
    for op in reads:
        if op.status not in (200, 404):
            continue
        found = 0 if op.status == 404 else _version_of(op.value, by_key.get(op.key, []))
        verdict.count("reads-real")
        if found is None:
            verdict.fail("reads-real", _made_up(op, by_key.get(op.key, [])))
            continue
        version: int = found
        if op.token_version is not None:
            verdict.count("reads-token")
            if version < op.token_version:
                verdict.fail(
                    "reads-token",
                    f"op {op.id} ({op.key}): version {version} < token's {op.token_version}",
                )
        if op.max_lag is not None and (op.served_by or {}).get("role") == "standby":
            _max_lag(op, version, acknowledged, by_key.get(op.key, []), verdict)


def _made_up(op: Op, log: list[Event]) -> str:
    """What a read answered that no prefix of ``log`` folds to, with what tells where it came
    from: when, which instance and copy, and the nearest values of the log's prefixes."""
    sums, total = [], 0
    for event in log:
        total += event.quantity or 0
        sums.append(total)
    on_hand = op.value.get("on_hand") if isinstance(op.value, dict) else None
    below = max((s for s in sums if isinstance(on_hand, int) and s < on_hand), default=None)
    above = min((s for s in sums if isinstance(on_hand, int) and s > on_hand), default=None)
    return (
        f"op {op.id} ({op.key}): {op.value} is no prefix of its log (prefixes {below} and "
        f"{above} around it; read at {op.start:.1f}s from {op.answered_by}, served_by "
        f"{op.served_by})"
    )


def _version_of(value: Any, log: list[Event]) -> int | None:
    """The version whose fold ``value`` is, or None when no prefix of ``log`` folds to it."""
    if not isinstance(value, dict) or not isinstance(value.get("on_hand"), int):
        return None
    total = 0
    candidates = []
    for event in log:
        total += event.quantity or 0
        if total == value["on_hand"]:
            candidates.append(event.version)
    return max(candidates) if candidates else None


def _max_lag(
    op: Op, version: int, acknowledged: list[Op], log: list[Event], verdict: Verdict
) -> None:
    """A standby answering with ``max_lag`` M had applied every record more than M before
    the partition's end as it stood :data:`LAG_SLACK_S` before the read."""
    if not log:
        return
    partition = log[0].partition
    ends = [
        c.position[1] + 2  # past the command's transaction marker
        for c in acknowledged
        if c.position is not None and c.position[0] == partition and c.end < op.start - LAG_SLACK_S
    ]
    if not ends:
        return
    verdict.count("reads-max-lag")
    floor = max(ends) - (op.max_lag or 0)
    owed = [e.version for e in log if e.offset < floor]
    if owed and version < max(owed):
        verdict.fail(
            "reads-max-lag",
            f"op {op.id} ({op.key}) max_lag {op.max_lag}: version {version}, owed {max(owed)} "
            f"(end {max(ends)}, served_by {op.served_by})",
        )


def _redirects(history: History, verdict: Verdict) -> None:
    """No 307 sends a client to an instance dead or paused for longer than the slack."""
    down = _down_spans(history)
    for op in history.ops:
        for hop in op.hops:
            if hop.status != 307 or not hop.location:
                continue
            verdict.count("no-dead-redirect")
            for url, since, until in down:
                if (
                    hop.location.startswith(url + "/")
                    and since + SUSPECT_SLACK_S < hop.end <= until
                ):
                    verdict.fail(
                        "no-dead-redirect",
                        f"op {op.id}: 307 to {url} at {hop.end:.2f}, down since {since:.2f}",
                    )


def _down_spans(history: History) -> list[tuple[str, float, float]]:
    """(URL, since, until) of every stretch an instance was killed or paused."""
    spans: list[tuple[str, float, float]] = []
    since: dict[str, float] = {}
    for fault in history.faults:
        if not fault.target.startswith("instance "):
            continue
        if fault.action in ("kill", "pause"):
            since[fault.target] = fault.at
        elif fault.action in ("restart", "resume") and fault.target in since:
            spans.append((fault.target, since.pop(fault.target), fault.at))
    spans += [(target, at, float("inf")) for target, at in since.items()]
    urls = {f"instance {n}": url for n, url in enumerate(history.urls)}
    return [(urls[target], start, end) for target, start, end in spans if target in urls]


def _retry_after(ops: list[Op], verdict: Verdict) -> None:
    for op in ops:
        for hop in op.hops:
            if hop.status == 503:
                verdict.count("retry-after")
                if not hop.retry_after:
                    verdict.fail(
                        "retry-after", f"op {op.id}: 503 from {hop.url} without Retry-After"
                    )
