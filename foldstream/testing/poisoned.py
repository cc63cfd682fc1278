"""A service for poison-record features: the inventory domain, its ``stock`` store, and a
queryable topic (``poisoned.notes``, JSON values) in the store ``notes``, both with the default
policy for records they cannot fold (``on_error="dead-letter"``). Its topics are its own
(``poisoned.*``), so the records its features write reach no other service.
"""

from __future__ import annotations

from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product
from foldstream.projections import EventProjection, LatestValue
from foldstream.service import Service

NOTES_TOPIC = "poisoned.notes"

service = Service(
    name="poisoned",
    aggregates={"product": Product},
    projections=[
        EventProjection("stock", fold_stock),
        LatestValue("notes", topic=NOTES_TOPIC),
    ],
)
