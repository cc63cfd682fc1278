"""The query parameters of every HTTP route, declared once: each route refuses any other (400
naming it), and the OpenAPI document (:mod:`foldstream.openapi`) publishes these declarations.

A parameter a route does not take is never ignored: a misspelt ``expected_version`` would run
a command without its version check, a misspelt ``consistent_with`` or ``max_lag`` (or a
lookup's ``after``, a spelling an earlier design used) would answer a read the client did not
ask for. The routes that parse their query anyway (commands, lookups, batches, ranges, windows,
owners; :mod:`foldstream.query_api.answers` for every path a lookup can take) check it where
they parse it, after the URL's length; the others are wrapped by :func:`refusing_unknown`.

``hops`` is the one parameter clients do not send: the instance that redirects a request (307)
adds it (:mod:`foldstream.routing`), so every route that redirects takes it.
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from foldstream.errors import InvalidRequest
from foldstream.http_input import Params, query_params
from foldstream.responses import error_answer, to_response

#: The most unknown names an error shows, and the most characters of each.
SHOWN_NAMES = 5
SHOWN_CHARS = 40
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class QueryParam:
    """A query parameter: its name, what it does and its JSON schema (as OpenAPI shows it)."""

    name: str
    description: str
    schema: Mapping[str, Any]

    def openapi(
        self, description: str | None = None, schema: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Its OpenAPI parameter object (``description``/``schema``: a route's own wording)."""
        return {
            "name": self.name,
            "in": "query",
            "description": description or self.description,
            "schema": dict(schema or self.schema),
        }


@dataclass(frozen=True)
class RouteParams:
    """The query parameters route ``route`` (``"GET /stores/{store}/keys/{key}"``) takes."""

    route: str
    takes: tuple[QueryParam, ...] = ()
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(p.name for p in self.takes))

    def check(self, params: Params) -> None:
        """:class:`InvalidRequest` (400) naming the parameters of ``params`` not taken."""
        unknown = [name for name, _ in params if name not in self.names]
        if unknown:
            raise InvalidRequest(self.refusal(unknown))

    def checked(self, query_string: bytes) -> Params:
        """The parameters of ``query_string``, every one taken (else :class:`InvalidRequest`)."""
        params = query_params(query_string)
        self.check(params)
        return params

    def refusal(self, unknown: list[str]) -> str:
        """What a request sending the parameters ``unknown`` is answered (bounded)."""
        names = list(dict.fromkeys(unknown))
        shown = ", ".join(self._shown(name) for name in names[:SHOWN_NAMES])
        if len(names) > SHOWN_NAMES:
            shown += f" and {len(names) - SHOWN_NAMES} more"
        takes = ", ".join(p.name for p in self.takes) or "none"
        return (
            f"unknown query parameter(s) of {self.route}: {shown}; this route takes {takes} "
            "(a parameter it does not take is refused, never ignored)"
        )

    def _shown(self, name: str) -> str:
        shown = repr(name[:SHOWN_CHARS]) + ("..." if len(name) > SHOWN_CHARS else "")
        close = difflib.get_close_matches(name[:64], sorted(self.names), n=1, cutoff=0.75)
        return f"{shown} (did you mean {close[0]!r}?)" if close else shown

    def openapi(self, **own: dict[str, Any]) -> list[dict[str, Any]]:
        """The OpenAPI parameter objects, ``own[name]`` (``description``, ``schema``) for the
        route's own wording of a parameter."""
        return [p.openapi(**own.get(p.name, {})) for p in self.takes]


def refusing_unknown(params: RouteParams, endpoint: Endpoint) -> Endpoint:
    """``endpoint``, answering 400 first to a request with a parameter ``params`` lacks."""

    async def checked(request: Request) -> Response:
        query_string: bytes = request.scope["query_string"]
        if query_string:
            try:
                params.checked(query_string)
            except InvalidRequest as exc:
                return to_response(error_answer(exc.status, str(exc)))
        return await endpoint(request)

    checked.__name__ = getattr(endpoint, "__name__", "endpoint")
    return checked


class RefusingUnknown:
    """An ASGI app (the pages' files) answering 400 first to a request with a parameter
    ``params`` lacks."""

    def __init__(self, app: ASGIApp, params: RouteParams) -> None:
        self.app = app
        self.params = params

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["query_string"]:
            try:
                self.params.checked(scope["query_string"])
            except InvalidRequest as exc:
                await to_response(error_answer(exc.status, str(exc)))(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- the parameters --------------------------------------------------------------------------

_COUNT = {"type": "integer", "minimum": 0}
HOPS = QueryParam(
    "hops",
    "added by the instance that redirected the request (307): how many redirects it took so "
    "far, at most 3 (clients do not send it)",
    _COUNT,
)
MAX_LAG = QueryParam(
    "max_lag",
    "a standby copy at most this many records behind may answer; any: a copy of any lag, "
    "even unknown (a standby not measured yet, or an owner cut off from the cluster)",
    {"oneOf": [_COUNT, {"const": "any"}]},
)
CONSISTENT_WITH = QueryParam(
    "consistent_with",
    "a command's consistency token: answer only with state that includes that command (waits "
    "a bounded time, then 503 with Retry-After); or the header Foldstream-Consistent-With",
    {"type": "string", "maxLength": 64},
)
EXPECTED_VERSION = QueryParam(
    "expected_version",
    "run only if the aggregate is at this version (0: no events); or the header If-Match",
    _COUNT,
)
FROM = QueryParam("from", "inclusive lower bound of the sort keys", {"type": "string"})
TO = QueryParam("to", "exclusive upper bound of the sort keys", {"type": "string"})
LIMIT = QueryParam("limit", "entries a page holds at most", {"type": "integer", "minimum": 1})
AFTER = QueryParam(
    "after",
    "the previous page's next, with the same from and to",
    {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
)

COMMAND = RouteParams("POST /commands/{aggregate}/{id}/{command}", (EXPECTED_VERSION, HOPS))
LOOKUP = RouteParams("GET /stores/{store}/keys/{key}", (MAX_LAG, CONSISTENT_WITH, HOPS))
_ORDERED = (FROM, TO, LIMIT, AFTER, MAX_LAG, CONSISTENT_WITH, HOPS)
RANGE_READ = RouteParams("GET /stores/{store}/keys/{key}/range", _ORDERED)
WINDOWS_READ = RouteParams("GET /stores/{store}/keys/{key}/windows", _ORDERED)
#: A batch is never redirected (keys owned elsewhere are listed by owner) nor read from a
#: standby: no ``hops``, no ``max_lag``.
BATCH = RouteParams("POST /stores/{store}/keys", (CONSISTENT_WITH,))
OWNERS = RouteParams("GET /stores/{store}/owners/{key}")
STORES = RouteParams("GET /stores")
REBUILD = RouteParams("POST /stores/{store}/rebuilds")
CLUSTER = RouteParams("GET /cluster")
HEALTH = RouteParams("GET /health")
READY = RouteParams("GET /ready")
METRICS = RouteParams("GET /metrics")
OPENAPI = RouteParams("GET /openapi.json")
DOCS = RouteParams("GET /docs/")
UI = RouteParams("GET /ui/")
UI_LOOKUP = RouteParams("GET /ui/api/lookup/{store}/{key}")
