"""A service whose store deletes keys, for the compaction features: the inventory domain with
one store, ``in_stock``, holding what each product has on hand while it has any; a product
sold out is deleted from it (its changelog gets a tombstone). Its topics are its own
(``stockroom.*``)."""

from __future__ import annotations

from typing import Any

from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product
from foldstream.projections import EventProjection
from foldstream.service import Service


def fold_in_stock(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """``in_stock``: the product's stock while it has any; None (deleted) once sold out."""
    stock = fold_stock(state, event)
    return stock if stock is not None and stock["on_hand"] > 0 else None


service = Service(
    name="stockroom",
    aggregates={"product": Product},
    projections=[EventProjection("in_stock", fold_in_stock)],
)
