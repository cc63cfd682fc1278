"""Where a request for one partition is answered: here, at another member, or not right now.

The query and command routes ask a :class:`Locator` (the cluster node) and turn its answer into
HTTP: a :class:`Local` answer is served, a :class:`Redirect` becomes a 307 to the same path on
the owner (with a hop counter, so a disagreement between members cannot loop), and
:class:`Unavailable` becomes a 503 with ``Retry-After``: never a silent wrong or empty answer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final, Literal, Protocol
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from foldstream.errors import InvalidRequest
from foldstream.http_input import Params, count, last, query_params
from foldstream.responses import NO_STORE, Answer, error_answer, to_response

HOPS_PARAM = "hops"
MAX_HOPS = 3


#: ``?max_lag=any``: a copy of any lag may answer, even one whose lag is not known: a standby
#: copy not measured yet, or the active copy of an owner whose view of the cluster is not current
#: (it may have been replaced without knowing: ``"unconfirmed"``).
ANY_LAG: Final = "any"
MaxLag = int | Literal["any"] | None
"""How far behind a copy answering a read may be: records, :data:`ANY_LAG`, or None (only the
active copy of an owner whose view is current)."""


def within(lag: int | None, max_lag: MaxLag) -> bool:
    """Whether a copy ``lag`` records behind (None: not known) may answer a read allowing
    ``max_lag``."""
    if max_lag == ANY_LAG:
        return True
    return lag is not None and max_lag is not None and lag <= max_lag


def max_lag_param(raw: str | None) -> MaxLag:
    """The ``max_lag`` query parameter: a count of records or ``any``; InvalidRequest else."""
    if raw == ANY_LAG:
        return ANY_LAG
    return count("max_lag", raw, alternative=f" or {ANY_LAG!r} (a copy of any lag)")


@dataclass(frozen=True)
class Local:
    """Answer here, from this instance's ``role`` copy of ``partition`` (``lag`` behind, None:
    not known). ``unconfirmed``: the active copy of an owner whose view of the cluster is not
    current (it may have been replaced meanwhile), served only with :data:`ANY_LAG`."""

    partition: int
    role: Literal["active", "standby", "unconfirmed"]
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
    def locate(self, topic: str, partition: int, *, max_lag: MaxLag = None) -> Location:
        """Where a read (``max_lag`` set: standby copies allowed) or write is answered."""
        ...


def unavailable_answer(location: Unavailable) -> Answer:
    """503 with ``Retry-After``: nobody can answer for ``location.partition`` right now."""
    return error_answer(
        503,
        f"partition {location.partition}: {location.reason}",
        [(b"retry-after", b"%d" % location.retry_after_s), NO_STORE],
        partition=location.partition,
    )


def redirect_answer(location: Redirect, raw_path: bytes, params: Params) -> Answer:
    """307 to the same path and query on ``location.url``, counting hops: the one place a
    redirect's ``Location`` is built. 503 after :data:`MAX_HOPS` hops (the members disagree
    on the owner); :class:`~foldstream.errors.InvalidRequest` if ``hops`` is no count."""
    hops = count(HOPS_PARAM, last(params, HOPS_PARAM)) or 0
    if hops >= MAX_HOPS:
        return unavailable_answer(
            Unavailable(location.partition, f"members disagree on the owner after {hops} hops")
        )
    query = [(k, v) for k, v in params if k != HOPS_PARAM]
    target = redirect_target(location.url, raw_path, query, hops + 1)
    return Answer(307, [(b"location", target.encode("latin-1")), NO_STORE], b"")


def unavailable(location: Unavailable) -> Response:
    return to_response(unavailable_answer(location))


def redirect(request: Request, location: Redirect) -> Response:
    """:func:`redirect_answer` for a Starlette request (400 if its ``hops`` is no count)."""
    # The raw path keeps the key's percent-encoding exactly as the client sent it.
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    try:
        answer = redirect_answer(location, raw_path, query_params(request.scope["query_string"]))
    except InvalidRequest as exc:
        answer = error_answer(exc.status, str(exc))
    return to_response(answer)


def redirect_target(url: str, raw_path: bytes, query: Params, hops: int) -> str:
    """``raw_path`` with ``query`` on the member at ``url``, counting ``hops``."""
    # Most redirects carry no other parameter: no need to pay urlencode's quoting for them.
    params = f"{urlencode(query)}&" if query else ""
    return f"{url.rstrip('/')}{raw_path.decode('latin-1')}?{params}{HOPS_PARAM}={hops:d}"


class LocalOnly:
    """A :class:`Locator` for an app without a cluster: the partitions ``owned()`` returns are
    answered here, every other one is unavailable (503)."""

    def __init__(self, owned: Callable[[], Collection[int]], instance: str = "local") -> None:
        self._owned = owned
        self.instance = instance

    def locate(self, topic: str, partition: int, *, max_lag: MaxLag = None) -> Location:
        if partition in self._owned():
            return Local(partition, "active", None, self.instance)
        return Unavailable(partition, "this instance does not own it")
