"""Reading an ordered store's ranges and a windowed store's windows over HTTP, every page of
them: what the demo, the test steps and the bench compare with a plain computation."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import quote, urlencode

from foldstream.errors import FoldstreamError
from foldstream.process import http

Read = Literal["range", "windows"]
#: The field of a ``range`` or ``windows`` answer that holds its items.
ITEMS = {"range": "entries", "windows": "windows"}
MAX_PAGES = 10_000


def read_path(store: str, key: str, read: Read, **params: Any) -> str:
    """The path (and query) of a ``read`` of ``key``: a ``/`` in the key is sent as ``%2F``."""
    given = {k.rstrip("_"): v for k, v in params.items() if v is not None}  # from_ -> from
    query = f"?{urlencode(given)}" if given else ""
    return f"/stores/{quote(store, safe='')}/keys/{quote(key, safe='')}/{read}{query}"


def read_all(
    base_url: str, store: str, key: str, read: Read = "range", **params: Any
) -> tuple[int, Any]:
    """``(200, every item)`` of a ``read`` of ``key`` (redirects followed, ``next`` pages
    read until the last), or the first answer that is not 200 as ``(status, body)``.
    ``params``: ``from_``, ``to``, ``limit``, ``max_lag``."""
    items: list[Any] = []
    after = None
    for _ in range(MAX_PAGES):
        status, body = http("GET", base_url + read_path(store, key, read, after=after, **params))
        if status != 200:
            return status, body
        items += body[ITEMS[read]]
        after = body["next"]
        if after is None:
            return 200, items
    raise FoldstreamError(f"{store}/{key}: more than {MAX_PAGES} pages")
