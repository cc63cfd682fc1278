"""A service whose event changed shape, for the upcasting test: accounts whose deposits were
kept in whole euros (``Account.Deposited`` version 1: ``{"euros": 5}``) and are kept in cents
since (version 2: ``{"cents": 500}``, with its ``upcast_v1_v2``), as eventsourcing upcasts
events: ``class_version`` on the event class, one ``upcast_vX_vY`` static method per step.

Events version 1 wrote stay in Kafka as they were; every reader decodes them through the
upcaster (:class:`~foldstream.domain.records.EventCodec`): the command side's replay and the
``balances`` fold. Its topics are its own (``ledger.*``).
"""

from __future__ import annotations

from typing import Any

from foldstream.domain import Aggregate, DomainRuleViolation, command, event
from foldstream.projections import EventProjection
from foldstream.service import Service


class Account(Aggregate):
    """A bank account, its balance in cents."""

    def __init__(self, id: str) -> None:  # noqa: A002 - eventsourcing's name for the id
        self.balance = 0

    class Deposited(Aggregate.Event):
        """Money paid in, in cents (version 1 held whole euros)."""

        cents: int
        class_version = 2

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["cents"] = state.pop("euros") * 100

    @command
    def deposit(self, cents: int) -> None:
        """Pay ``cents`` in."""
        if cents <= 0:
            raise DomainRuleViolation(f"a deposit is of at least one cent, got {cents}")
        self._deposited(cents)

    @command
    def withdraw(self, cents: int) -> None:
        """Take ``cents`` out; refused beyond the balance."""
        if not 0 < cents <= self.balance:
            raise DomainRuleViolation(f"cannot withdraw {cents} cents: {self.balance} in {self.id}")
        self._withdrawn(cents)

    @event(Deposited)
    def _deposited(self, cents: int) -> None:
        self.balance += cents

    @event("Withdrawn")
    def _withdrawn(self, cents: int) -> None:
        self.balance -= cents


def fold_balance(state: dict[str, Any] | None, domain_event: Any) -> dict[str, Any]:
    """An account's balance in cents, and its number of deposits."""
    balance = state or {"cents": 0, "deposits": 0}
    if isinstance(domain_event, Account.Deposited):
        return {"cents": balance["cents"] + domain_event.cents, "deposits": balance["deposits"] + 1}
    if isinstance(domain_event, Account.Withdrawn):
        return {**balance, "cents": balance["cents"] - domain_event.cents}
    return balance


service = Service(
    name="ledger",
    aggregates={"account": Account},
    projections=[EventProjection("balances", fold_balance)],
)
