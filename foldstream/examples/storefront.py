"""A storefront: the inventory domain (seed 002) plus a queryable topic it does not write
(seed 003), as a service of its own (topics ``storefront.*``).

``supplier.ratings`` is written by another team's Java-compatible producer (murmur2, text
values); the store ``ratings`` serves its latest value per supplier, partitioned and routed
exactly as that producer partitioned it. The cluster demo and tests run this service. (It
leaves the inventory's ``sales_10m`` out: the cluster's features and bench measure stock.)
"""

from __future__ import annotations

from foldstream.examples import inventory
from foldstream.projections import LatestValue
from foldstream.service import Service

RATINGS_TOPIC = "supplier.ratings"

service = Service(
    name="storefront",
    aggregates=inventory.service.aggregates,
    projections=[
        inventory.service.projection("stock"),
        LatestValue("ratings", topic=RATINGS_TOPIC, value_format="string", partitioner="murmur2"),
    ],
)
