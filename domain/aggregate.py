"""The aggregate base class, the command marker and the domain rule error."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from eventsourcing.domain import (
    BaseAggregate,
    CanInitAggregate,
    CanMutateAggregate,
    MetaDomainEvent,
)

F = TypeVar("F", bound=Callable[..., Any])
_COMMAND_MARK = "__foldstream_command__"


class DomainRuleViolation(Exception):
    """A command broke a rule of the domain (e.g. selling more than is on hand).

    Raise it from a command method before any event is triggered; the command is rejected
    (HTTP 422 with the message as the reason) and nothing is appended.
    """


@dataclass(frozen=True)
class KeyedAggregateEvent(CanMutateAggregate[str], metaclass=MetaDomainEvent):
    """An event of an aggregate whose id is a string (eventsourcing's DomainEvent needs UUIDs)."""

    originator_id: str
    originator_version: int
    timestamp: datetime


@dataclass(frozen=True)
class KeyedAggregateCreated(CanInitAggregate[str], KeyedAggregateEvent):
    """The first event of an aggregate whose id is a string."""

    originator_topic: str


class Aggregate(BaseAggregate[str]):
    """An eventsourcing aggregate identified by a string, used as the Kafka record key.

    Subclasses take their id as ``__init__(self, id: str)``, so that a command sent to an id
    with no history creates the aggregate first (``Product(id="sku-1")``).
    """

    class Event(KeyedAggregateEvent):
        pass

    class Created(Event, KeyedAggregateCreated):
        pass


def command(method: F) -> F:
    """Mark an aggregate method as a command that clients may send (``POST /commands/...``)."""
    setattr(method, _COMMAND_MARK, True)
    return method


def commands_of(aggregate_class: type) -> dict[str, inspect.Signature]:
    """The commands an aggregate class exposes, with their signatures (``self`` removed)."""
    found: dict[str, inspect.Signature] = {}
    for name, member in inspect.getmembers(aggregate_class):
        if getattr(member, _COMMAND_MARK, False):
            signature = inspect.signature(member)
            found[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return found
