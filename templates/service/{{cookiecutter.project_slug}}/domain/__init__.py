"""The domain of {{ cookiecutter.service_name }}: aggregates, their commands, events and rules.

No infrastructure here: ``foldstream serve`` loads an aggregate, runs a ``@command`` method and
appends the events it triggered to Kafka.
"""

from __future__ import annotations

from foldstream.domain import Aggregate, DomainRuleViolation, command, event


class Product(Aggregate):
    """A stock-keeping unit; its id is the SKU."""

    def __init__(self, id: str) -> None:  # noqa: A002 - eventsourcing's name for the id
        self.on_hand = 0

    @command
    def receive_shipment(self, quantity: int) -> None:
        """Add ``quantity`` items that arrived from a supplier."""
        if quantity <= 0:
            raise DomainRuleViolation(f"a shipment must hold at least one item, got {quantity}")
        self._shipment_received(quantity)

    @command
    def sell(self, quantity: int) -> None:
        """Sell ``quantity`` items; rejected when fewer are on hand."""
        if quantity <= 0:
            raise DomainRuleViolation(f"a sale must be of at least one item, got {quantity}")
        if quantity > self.on_hand:
            raise DomainRuleViolation(f"cannot sell {quantity}: only {self.on_hand} on hand")
        self._items_sold(quantity)

    @event("ShipmentReceived")
    def _shipment_received(self, quantity: int) -> None:
        self.on_hand += quantity

    @event("ItemsSold")
    def _items_sold(self, quantity: int) -> None:
        self.on_hand -= quantity
