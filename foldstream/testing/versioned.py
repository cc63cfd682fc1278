"""A service whose fold changes, for the version features: the inventory domain and its
``stock`` store as deployed first (``before``: version 1 alone) and after a changed fold is
deployed beside it (``after``: version 2, which also counts each product's moves). Its topics
are its own (``versioned.*``).

While the file named by the environment variable :data:`GATE_ENV` is missing, version 2's fold
waits for it: a feature holds the new version back while it checks that the old one answers,
then lets it build (Spark's Python workers inherit the instance's environment).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product
from foldstream.projections import EventProjection
from foldstream.service import Service

GATE_ENV = "VERSIONED_FEATURE_GATE"  # the feature's own, not a setting
#: The longest a fold waits at the gate: a feature that failed before opening it must not
#: leave a query stuck for the rest of the run.
GATE_WAIT_S = 600.0


def fold_stock_v2(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """Version 2 of ``stock``: what version 1 holds, and how many events moved the product."""
    _wait_at_gate()
    moves = 0 if state is None else state["moves"]
    return {**(fold_stock(state, event) or {}), "moves": moves + 1}


def _wait_at_gate() -> None:
    gate = os.environ.get(GATE_ENV)
    deadline = time.monotonic() + GATE_WAIT_S
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


before = Service(
    name="versioned",
    aggregates={"product": Product},
    projections=[EventProjection("stock", fold_stock)],
)

after = Service(
    name="versioned",
    aggregates={"product": Product},
    projections=[
        EventProjection("stock", fold_stock),
        EventProjection("stock", fold_stock_v2, version=2),
    ],
)
