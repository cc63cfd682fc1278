"""The query side: read-model lookups over HTTP (Starlette)."""

from __future__ import annotations

from foldstream.query_api.http import query_routes
from foldstream.query_api.stores import StoreReaders

__all__ = ["StoreReaders", "query_routes"]
