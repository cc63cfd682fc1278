"""The re-key throughput figure's service (``bench/rekey.py``): the positions example's
``exposure`` trades input alone, a store re-keyed by asset (through its repartition topic)
folding ``add_trade``: the work the plain reference does, and nothing else.

The positions example itself also folds ``positions`` from the same events and ``prices``
from the market's topic, and joins prices into ``exposure``: work the reference does not do,
which would be counted against the re-key if the figure measured that service. Run as
``foldstream serve --service bench.rekey_service:service``.
"""

from __future__ import annotations

from foldstream.examples.positions import Account, add_trade, traded_asset
from foldstream.projections import EventProjection
from foldstream.service import Service

__all__ = ["service"]

service = Service(
    name="rekeyed",
    aggregates={"account": Account},
    projections=[EventProjection("exposure", add_trade, key=traded_asset)],
)
