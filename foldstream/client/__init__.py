"""A Python client of a foldstream service (httpx; sync and async).

::

    from foldstream.client import FoldstreamClient

    with FoldstreamClient("http://127.0.0.1:8000") as client:
        client.command("product", "sku-1", "receive_shipment", {"quantity": 5})
        client.get("stock", "sku-1")                    # {"on_hand": 5}
        client.get_many("stock", ["sku-1", "sku-2"])    # Batch(values=..., missing=[...])

It reads the cluster map (``GET /cluster``) and sends each request straight to the instance
owning its key's partition; batch lookups are split by owner. A 307 is followed (with the hop
limit) and makes it read the map again; a 503 or an unreachable instance is retried after the
``Retry-After`` the instance asked for (tenacity), until ``retry_timeout``. Errors are typed
(:mod:`foldstream.client.errors`). A command is sent with an ``Idempotency-Key`` (one per
call, or the caller's) and resent with it until a definite answer comes: the instances apply it
once and answer every attempt alike. Only when none came within ``retry_timeout`` does
:class:`~foldstream.client.errors.OutcomeUnknown` hand the key to the caller.
"""

from __future__ import annotations

from foldstream.client.aio import AsyncFoldstreamClient
from foldstream.client.errors import (
    BadRequest,
    ClientError,
    IdempotencyKeyReused,
    KeyNotFound,
    NotFound,
    OutcomeUnknown,
    Rejected,
    TooManyRedirects,
    Unauthorized,
    Unavailable,
    VersionConflict,
)
from foldstream.client.flows import Batch
from foldstream.client.sync import FoldstreamClient

__all__ = [
    "AsyncFoldstreamClient",
    "BadRequest",
    "Batch",
    "ClientError",
    "FoldstreamClient",
    "IdempotencyKeyReused",
    "KeyNotFound",
    "NotFound",
    "OutcomeUnknown",
    "Rejected",
    "TooManyRedirects",
    "Unauthorized",
    "Unavailable",
    "VersionConflict",
]
