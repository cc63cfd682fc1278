"""The domain layer: aggregates, their commands and events. Imports no infrastructure.

Aggregates are eventsourcing aggregates keyed by a string id (the Kafka record key)::

    class Product(Aggregate):
        def __init__(self, id: str) -> None:
            self.on_hand = 0

        @command
        def sell(self, quantity: int) -> None:
            if quantity > self.on_hand:
                raise DomainRuleViolation(f"only {self.on_hand} on hand")
            self._sold(quantity)

        @event("ItemsSold")
        def _sold(self, quantity: int) -> None:
            self.on_hand -= quantity

See :mod:`foldstream.domain.records` for how events map to Kafka records.
"""

from __future__ import annotations

from eventsourcing.domain import event

from foldstream.domain.aggregate import Aggregate, DomainRuleViolation, command, commands_of
from foldstream.domain.records import EventCodec, EventRecord

__all__ = [
    "Aggregate",
    "DomainRuleViolation",
    "EventCodec",
    "EventRecord",
    "command",
    "commands_of",
    "event",
]
