"""Aggregates whose events could not be replayed, as the aggregate store keeps them.

When a replay cannot apply an event of an aggregate (:mod:`.replay`), the aggregate's state is
unknown from there on: it takes no commands (:class:`AggregateUnreplayable`). With snapshots in
a store, that must outlive the replay: a later takeover replays only the events past the
snapshots' position and would otherwise find the aggregate's last good snapshot and apply its
next events to it as if nothing had been skipped. So the replay writes a *marker* as the
aggregate's value (why, the offset of the event it could not apply, and the snapshot before
it), and lists the aggregate in the partition's :data:`INDEX_KEY`. A later takeover replays
from the earliest listed offset the events of the listed aggregates only, from their kept
snapshots: once the code that decodes the event is deployed (an event class, an upcaster), a
restart or a move of the partition makes the aggregate whole again, as before snapshots.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from foldstream.errors import FoldstreamError

log = logging.getLogger(__name__)

#: The key of the partition's list of unreplayable aggregates: not UTF-8, so no aggregate id.
INDEX_KEY = b"\xff\xffunreplayable"
#: Aggregates a partition's index lists at most (the index is one changelog record); the
#: others keep refusing commands, but a takeover does not try them again.
MAX_INDEXED = 10_000
_MARKER = b'{"unreplayable":'


class AggregateUnreplayable(FoldstreamError):
    """An event of the aggregate on the events topic could not be replayed (HTTP 409): its
    state is unknown, so no command runs on it; the partition's other aggregates are unaffected.

    Remedy: the message names the record (partition, offset) and the cause. Deploy what decodes
    it (the event class, an upcaster, ``register_topic`` for an old type name), then restart
    the instance (or move the partition) so that it is replayed again.
    """

    def __init__(self, aggregate_id: str, reason: str) -> None:
        super().__init__(f"aggregate {aggregate_id!r} cannot take commands: {reason}")
        self.aggregate_id = aggregate_id


@dataclass(frozen=True)
class Broken:
    """Why an aggregate takes no commands, the offset of the event that could not be applied,
    and its snapshot before that event (None: it had none)."""

    reason: str
    at: int
    before: bytes | None = None

    def encode(self) -> bytes:
        before = None
        if self.before is not None:
            before = self.before.decode("utf-8", errors="replace")
        return json.dumps(
            {"unreplayable": self.reason, "at": self.at, "before": before}, separators=(",", ":")
        ).encode()


def is_marker(value: bytes) -> bool:
    return value.startswith(_MARKER)


def decode_marker(value: bytes) -> Broken:
    """The marker ``value`` holds; a marker that does not parse (a forged record) still makes
    its aggregate refuse commands, with no snapshot to repair it from."""
    try:
        found = json.loads(value)
        reason, at, before = found["unreplayable"], found["at"], found["before"]
        if not isinstance(reason, str) or type(at) is not int or at < 0:
            raise ValueError("wrong types")
        if before is not None and not isinstance(before, str):
            raise ValueError("wrong types")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return Broken(f"its stored marker is malformed ({exc})", 0)
    return Broken(reason[:2000], at, None if before is None else before.encode())


def encode_index(broken: Mapping[str, Broken]) -> bytes | None:
    """The index listing ``broken`` (the first :data:`MAX_INDEXED` by offset); None when
    empty (the key is deleted)."""
    if not broken:
        return None
    listed = sorted(broken.items(), key=lambda item: item[1].at)
    if len(listed) > MAX_INDEXED:
        log.warning(
            "%d aggregates of one partition cannot be replayed; a takeover tries again only "
            "the first %d by offset",
            len(listed),
            MAX_INDEXED,
        )
    return json.dumps({i: b.at for i, b in listed[:MAX_INDEXED]}).encode()


def decode_index(value: bytes | None) -> dict[str, int]:
    """``{aggregate id: offset}`` of an index (empty for None or one that does not parse)."""
    if value is None:
        return {}
    try:
        found = json.loads(value)
    except (ValueError, RecursionError):
        log.warning("the index of unreplayable aggregates does not parse: ignored")
        return {}
    if not isinstance(found, dict):
        return {}
    return {
        str(i): at
        for i, at in list(found.items())[:MAX_INDEXED]
        if type(at) is int and at >= 0 and isinstance(i, str)
    }
