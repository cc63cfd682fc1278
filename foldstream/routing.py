"""Where a request for one partition is answered: here, at another member, or not right now.

The query and command routes ask a :class:`Locator` (the cluster node) and turn its answer into
HTTP: a :class:`Local` answer is served, a :class:`Redirect` becomes a 307 to the same path on
the owner (with a hop counter, so a disagreement between members cannot loop), and
:class:`Unavailable` becomes a 503 with ``Retry-After``: never a silent wrong or empty answer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from foldstream.responses import error_response

HOPS_PARAM = "hops"
MAX_HOPS = 3


@dataclass(frozen=True)
class Local:
    """Answer here, from this instance's ``role`` copy of ``partition`` (``lag`` behind)."""

    partition: int
    role: Literal["active", "standby"]
    lag: int | None
    instance: str


@dataclass(frozen=True)
class Redirect:
    """Send the client to ``url`` (the base URL of a live member that can answer)."""

    partition: int
    url: str


@dataclass(frozen=True)
class Unavailable:
    """No member can answer right now (a rebalance or restore is under way)."""

    partition: int
    reason: str
    retry_after_s: int = 1


Location = Local | Redirect | Unavailable


class Locator(Protocol):
    def locate(self, topic: str, partition: int, *, max_lag: int | None = None) -> Location:
        """Where a read (``max_lag`` set: standby copies allowed) or write is answered."""
        ...


def unavailable(location: Unavailable) -> JSONResponse:
    return JSONResponse(
        {
            "error": f"partition {location.partition}: {location.reason}",
            "partition": location.partition,
        },
        status_code=503,
        headers={"Retry-After": str(location.retry_after_s), "Cache-Control": "no-store"},
    )


def redirect(request: Request, location: Redirect) -> Response:
    """307 to the same path and query on ``location.url``, counting hops (400 if the client
    sent a ``hops`` that is not a non-negative integer)."""
    raw = request.query_params.get(HOPS_PARAM, "0") or "0"
    if not (raw.isascii() and raw.isdigit()):
        return error_response(400, f"{HOPS_PARAM} must be a non-negative integer, got {raw!r}")
    hops = int(raw)
    if hops >= MAX_HOPS:
        return unavailable(
            Unavailable(location.partition, f"members disagree on the owner after {hops} hops")
        )
    query = [(k, v) for k, v in request.query_params.multi_items() if k != HOPS_PARAM]
    # The raw path keeps the key's percent-encoding exactly as the client sent it.
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    return Response(
        status_code=307,
        headers={
            "Location": redirect_target(location.url, raw_path, query, hops + 1),
            "Cache-Control": "no-store",
        },
    )


def redirect_target(url: str, raw_path: bytes, query: list[tuple[str, str]], hops: int) -> str:
    """``raw_path`` with ``query`` on the member at ``url``, counting ``hops``."""
    # Most redirects carry no other parameter: no need to pay urlencode's quoting for them.
    params = f"{urlencode(query)}&" if query else ""
    return f"{url.rstrip('/')}{raw_path.decode('latin-1')}?{params}{HOPS_PARAM}={hops:d}"


def parse_max_lag(request: Request) -> int | None:
    """The ``max_lag`` query parameter (standby reads allowed within it); ValueError if bad."""
    raw = request.query_params.get("max_lag")
    if raw is None:
        return None
    value = int(raw)
    if value < 0:
        raise ValueError("max_lag must be >= 0")
    return value


class LocalOnly:
    """A :class:`Locator` for an app without a cluster: the partitions ``owned()`` returns are
    answered here, every other one is unavailable (503)."""

    def __init__(self, owned: Callable[[], Collection[int]], instance: str = "local") -> None:
        self._owned = owned
        self.instance = instance

    def locate(self, topic: str, partition: int, *, max_lag: int | None = None) -> Location:
        if partition in self._owned():
            return Local(partition, "active", None, self.instance)
        return Unavailable(partition, "this instance does not own it")
