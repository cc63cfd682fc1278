"""The copy of an aggregate that a command runs on, so a rejected command leaves no trace.

A command may raise after its events already changed the aggregate (a rule checked between two
events, or a bug in an event's apply). The handler therefore runs every command on a copy and
keeps the copy only when the command succeeded. A full ``copy.deepcopy`` was the largest single
cost of a command (about a sixth of the event loop's time per command under load); most
aggregates hold only immutable values (numbers, strings, datetimes, tuples of them), which a copy
may share, so only the mutable values are copied deeply. :func:`run_on_copy` runs a command
so.
"""

from __future__ import annotations

import copy
import copyreg
import datetime
import decimal
import functools
import uuid
from typing import Any, TypeVar

from foldstream.commands.outcomes import UnknownCommand, VersionConflict
from foldstream.domain import Aggregate, DomainRuleViolation

A = TypeVar("A")

_IMMUTABLE: frozenset[type] = frozenset(
    {
        int,
        float,
        complex,
        bool,
        str,
        bytes,
        type(None),
        decimal.Decimal,
        uuid.UUID,
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
    }
)


def _immutable(value: Any) -> bool:
    kind = type(value)
    if kind in _IMMUTABLE:
        return True
    if kind is tuple or kind is frozenset:
        return all(_immutable(item) for item in value)
    return False


#: Methods by which a class copies or pickles itself its own way.
_HOOKS = (
    "__deepcopy__", "__copy__", "__setstate__", "__getnewargs_ex__", "__getnewargs__",
)  # fmt: skip


@functools.cache
def _copies_by_dict(cls: type) -> bool:
    """Whether ``__dict__`` is the whole state of ``cls``'s instances, copied the default way."""
    slots = any(getattr(c, "__slots__", ()) for c in cls.__mro__ if "__slots__" in vars(c))
    custom = (
        any(hasattr(cls, name) for name in _HOOKS)
        or cls in copyreg.dispatch_table
        or cls.__getstate__ is not object.__getstate__  # type: ignore[comparison-overlap]
        or cls.__reduce_ex__ is not object.__reduce_ex__
        or cls.__reduce__ is not object.__reduce__
    )
    return not slots and not custom


def working_copy(aggregate: A) -> A:
    """A copy of ``aggregate`` that may be changed without changing ``aggregate``.

    The same as ``copy.deepcopy`` for an object whose state is its ``__dict__``: immutable
    attribute values are shared, every other one is deep-copied (with one memo, so values that
    two attributes share stay shared in the copy). Objects with ``__slots__`` or copying hooks
    of their own (``__deepcopy__``, ``__getstate__``...) are deep-copied whole.
    """
    state = getattr(aggregate, "__dict__", None)
    cls: type = type(aggregate)
    if state is None or not _copies_by_dict(cls):
        return copy.deepcopy(aggregate)
    # What copy.copy does for such an object, without its generic reduce/reconstruct steps.
    copied: Any = cls.__new__(cls)  # type: ignore[call-overload]
    vars(copied).update(state)
    memo: dict[int, Any] = {id(aggregate): copied}
    fresh = vars(copied)
    for name, value in state.items():
        if not _immutable(value):
            fresh[name] = copy.deepcopy(value, memo)
    return copied


def version_of(aggregate: Aggregate | None) -> int:
    """eventsourcing's version of ``aggregate``: 0 when it has no events yet."""
    return 0 if aggregate is None else int(aggregate.version)


def run_on_copy(
    cls: type[Aggregate],
    aggregate_id: str,
    current: Aggregate | None,
    expected_version: int | None,
    command: str,
    kwargs: dict[str, Any],
) -> tuple[Aggregate, list[Any]]:
    """Run ``command`` on a copy of ``current`` (a new ``cls`` when None), at
    ``expected_version`` when given: the copy and its new events. The copy is what a
    rejected command leaves its changes in, so none reach memory."""
    if current is not None and not isinstance(current, cls):
        raise UnknownCommand(
            f"{aggregate_id!r} is a {type(current).__name__}, not a {cls.__name__}"
        )
    if expected_version is not None and expected_version != version_of(current):
        raise VersionConflict(aggregate_id, expected_version, version_of(current))
    target = current if current is not None else cls(id=aggregate_id)  # type: ignore[call-arg]
    working = working_copy(target) if current is not None else target
    getattr(working, command)(**kwargs)
    events = list(working.collect_events())
    if not events:
        raise DomainRuleViolation(f"{command} changed nothing")
    return working, events
