"""Queryable topics (seed 003): latest value per key of topics other producers write.

``supplier.prices`` is written by a librdkafka producer with its default partitioner
(``consistent``, CRC32) and JSON values; ``supplier.ratings`` by a Java-compatible client
(murmur2) with plain-text values.
"""

from __future__ import annotations

from foldstream.projections import LatestValue
from foldstream.service import Service

service = Service(
    name="prices",
    projections=[
        LatestValue(
            "prices", topic="supplier.prices", value_format="json", partitioner="consistent"
        ),
        LatestValue(
            "ratings", topic="supplier.ratings", value_format="string", partitioner="murmur2"
        ),
    ],
)
