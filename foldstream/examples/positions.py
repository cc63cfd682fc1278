"""Positions and risk: each account's holdings, and the exposure to each asset, valued at the
latest market price (``foldstream.examples.positions:service``): the Interactive Queries
announcement's other example, as a re-keyed join.

- ``positions`` folds each account's trades (keyed by account).
- ``prices`` keeps the latest price of each asset from ``market.prices``, a topic another
  producer writes (key: the asset; value: ``{"price": <number>}``; partitioned with murmur2, the
  Java clients' default).
- ``exposure`` joins the trades, re-keyed by asset, with the price changes of the same asset:
  the quantity held over every account, the latest price (null before the first tick) and their
  product (null without a price). A trade or a price tick updates it, in either order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from numbers import Real
from typing import Any

from foldstream.domain import Aggregate, DomainRuleViolation, command, event
from foldstream.projections import Changes, EventProjection, Events, Join, LatestValue
from foldstream.service import DemoRecord, DemoRecords, Service

PRICES_TOPIC = "market.prices"
PRICE_PARTITIONS = 3


class Account(Aggregate):
    """A trading account; its id is the account number."""

    def __init__(self, id: str) -> None:  # noqa: A002 - eventsourcing's name for the id
        self.holdings: dict[str, int] = {}

    @command
    def buy(self, asset: str, quantity: int) -> None:
        """Buy ``quantity`` units of ``asset``."""
        _check_trade(asset, quantity)
        self._bought(asset, quantity)

    @command
    def sell(self, asset: str, quantity: int) -> None:
        """Sell ``quantity`` units of ``asset``; rejected when the account holds fewer."""
        _check_trade(asset, quantity)
        held = self.holdings.get(asset, 0)
        if quantity > held:
            raise DomainRuleViolation(
                f"cannot sell {quantity} {asset} from {self.id}: it holds {held}"
            )
        self._sold(asset, quantity)

    @event("Bought")
    def _bought(self, asset: str, quantity: int) -> None:
        self.holdings[asset] = self.holdings.get(asset, 0) + quantity

    @event("Sold")
    def _sold(self, asset: str, quantity: int) -> None:
        left = self.holdings.get(asset, 0) - quantity
        if left:
            self.holdings[asset] = left
        else:
            self.holdings.pop(asset, None)


def _check_trade(asset: str, quantity: int) -> None:
    if not asset:
        raise DomainRuleViolation("a trade names an asset")
    if quantity <= 0:
        raise DomainRuleViolation(f"a trade is of at least one unit, got {quantity}")


def _signed(event: Any) -> int:
    return int(event.quantity) if isinstance(event, Account.Bought) else -int(event.quantity)


def fold_positions(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """``positions``: what the account holds of each asset (assets at 0 dropped)."""
    if not isinstance(event, Account.Bought | Account.Sold):
        return state
    holdings = dict((state or {}).get("holdings", {}))
    left = holdings.get(event.asset, 0) + _signed(event)
    if left:
        holdings[event.asset] = left
    else:
        holdings.pop(event.asset, None)
    return {"account": event.originator_id, "holdings": holdings}


def traded_asset(event: Any) -> str | None:
    """``exposure``'s key of an event: the asset a trade is of (other events: none)."""
    return event.asset if isinstance(event, Account.Bought | Account.Sold) else None


def _valued(state: dict[str, Any]) -> dict[str, Any]:
    price = state["price"]
    return {**state, "value": None if price is None else state["quantity"] * price}


def _exposure(state: dict[str, Any] | None, asset: str) -> dict[str, Any]:
    return state or {"asset": asset, "quantity": 0, "price": None, "value": None}


def add_trade(state: dict[str, Any] | None, event: Any) -> dict[str, Any]:
    """``exposure``, a trade: the quantity held of the asset moves."""
    exposure = _exposure(state, event.asset)
    return _valued({**exposure, "quantity": exposure["quantity"] + _signed(event)})


def set_price(state: dict[str, Any] | None, change: Any) -> dict[str, Any]:
    """``exposure``, a price tick: the asset's price is the latest one (null once deleted)."""
    price = None if change.new is None else change.new.get("price")
    if price is not None and (not isinstance(price, Real) or isinstance(price, bool)):
        raise ValueError(f"the price of {change.key!r} is not a number: {change.new!r}")
    return _valued({**_exposure(state, change.key), "price": price})


def demo_ticks(rng: random.Random) -> Iterator[DemoRecord]:
    """``foldstream demo``'s price ticks: two of each asset the demo trades (its words)."""
    from foldstream.demo import WORDS  # not on the services' import path: only the demo's

    for asset in [*WORDS, *WORDS]:
        price = {"price": round(rng.uniform(1, 100), 2)}
        yield DemoRecord(PRICES_TOPIC, asset.encode(), json.dumps(price).encode())


service = Service(
    name="positions",
    aggregates={"account": Account},
    projections=[
        EventProjection("positions", fold_positions),
        LatestValue("prices", topic=PRICES_TOPIC, value_format="json", partitioner="murmur2"),
        Join(
            "exposure",
            inputs=[Events(add_trade, key=traded_asset), Changes("prices", fold=set_price)],
        ),
    ],
    demo=DemoRecords(topics={PRICES_TOPIC: PRICE_PARTITIONS}, records=demo_ticks),
)
