"""The retail inventory example (seed 002): ``foldstream.examples.inventory:service``."""

from __future__ import annotations

from typing import Any

from foldstream.examples.inventory.domain import Product
from foldstream.projections import EventProjection
from foldstream.service import Service


def fold_stock(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """``stock``: how many items of each SKU are on hand."""
    on_hand = 0 if state is None else state["on_hand"]
    if isinstance(event, Product.ShipmentReceived):
        on_hand += event.quantity
    elif isinstance(event, Product.ItemsSold):
        on_hand -= event.quantity
    return {"on_hand": on_hand}


service = Service(
    name="inventory",
    aggregates={"product": Product},
    projections=[EventProjection("stock", fold_stock)],
)
