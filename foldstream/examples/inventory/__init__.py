"""The retail inventory example (seed 002): ``foldstream.examples.inventory:service``.

Stores: ``stock`` (items on hand per SKU) and ``sales_10m`` (units sold per SKU in 10-minute
tumbling windows of the sales' own times, late sales accepted for a minute, windows kept for
a day): ``GET /stores/sales_10m/keys/sku-1/windows?from=2026-05-01T09:00Z&to=2026-05-01T10:00Z``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from foldstream.examples.inventory.domain import Product
from foldstream.projections import EventProjection, WindowedAggregate
from foldstream.service import Service


def fold_stock(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """``stock``: how many items of each SKU are on hand."""
    on_hand = 0 if state is None else state["on_hand"]
    if isinstance(event, Product.ShipmentReceived):
        on_hand += event.quantity
    elif isinstance(event, Product.ItemsSold):
        on_hand -= event.quantity
    return {"on_hand": on_hand}


def add_sale(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """``sales_10m``: units sold in a window (a window holds sales only)."""
    if not isinstance(event, Product.ItemsSold):
        return state
    return {"units": (0 if state is None else state["units"]) + event.quantity}


SALES_WINDOW = timedelta(minutes=10)

service = Service(
    name="inventory",
    aggregates={"product": Product},
    projections=[
        EventProjection("stock", fold_stock),
        WindowedAggregate(
            "sales_10m",
            fold=add_sale,
            size=SALES_WINDOW,
            grace=timedelta(minutes=1),
            retention=timedelta(days=1),
        ),
    ],
)
