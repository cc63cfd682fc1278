"""The read models: folds of the events into stores the query API serves."""

from __future__ import annotations

from typing import Any

from foldstream.projections import EventProjection, Projection

from {{ cookiecutter.package_name }}.domain import Product


def fold_stock(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """``stock``: how many items of each SKU are on hand."""
    on_hand = 0 if state is None else state["on_hand"]
    if isinstance(event, Product.ShipmentReceived):
        on_hand += event.quantity
    elif isinstance(event, Product.ItemsSold):
        on_hand -= event.quantity
    return {"on_hand": on_hand}


# A record a fold cannot handle goes to <service>.stock.dlq and the store moves on ("skip" and
# "stop" are the other policies): see foldstream's docs/operations/poison-records.md.
PROJECTIONS: list[Projection] = [EventProjection("stock", fold_stock, on_error="dead-letter")]
