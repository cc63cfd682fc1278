"""What a command comes to: the events an accepted command appended (:class:`CommandResult`),
or one of the rejections the command handler raises itself (:class:`UnknownCommand`,
:class:`VersionConflict`; the others are the domain's and :mod:`foldstream.errors`'). The
command routes (:mod:`.http`) map each to its answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from foldstream.errors import FoldstreamError

#: Fields every event has: the answer gives them as ``type`` and ``version`` or not at all.
_ENVELOPE = frozenset({"originator_id", "originator_version", "timestamp", "originator_topic"})


class UnknownCommand(FoldstreamError):
    """The aggregate or command named in a request does not exist (HTTP 404).

    Remedy: check the names against the service's aggregates and their ``@command`` methods.
    """


class VersionConflict(FoldstreamError):
    """The aggregate is not at the version the command expected (HTTP 409); nothing was appended.

    Versions are eventsourcing's: an aggregate's version is its last event's
    ``originator_version``; the first event is version 1, so an id without events is at 0.
    Remedy (client): read the aggregate again, decide again, resend with ``current_version``.
    """

    def __init__(self, aggregate_id: str, expected: int, current: int) -> None:
        super().__init__(f"{aggregate_id!r} is at version {current}, not {expected}")
        self.aggregate_id = aggregate_id
        self.expected = expected
        self.current = current


def describe(events: list[Any]) -> list[dict[str, Any]]:
    """Domain ``events`` as a command's answer lists them: type, version and own fields."""
    return [
        {
            "type": type(e).__qualname__,
            "version": e.originator_version,
            **{k: v for k, v in vars(e).items() if k not in _ENVELOPE},
        }
        for e in events
    ]


@dataclass(frozen=True)
class CommandResult:
    """The events a command appended and where the last one landed; ``remembered``: the
    outcome of an earlier attempt sent with the same ``Idempotency-Key`` (nothing appended
    now)."""

    events: list[dict[str, Any]]
    partition: int
    offset: int
    remembered: bool = False

    @classmethod
    def of(cls, events: list[Any], partition: int, offset: int) -> CommandResult:
        """The result of domain ``events`` (:func:`describe`)."""
        return cls(events=describe(events), partition=partition, offset=offset)
