"""Requests for a few hot routes sent straight to their endpoint, past Starlette's middleware
stack and route list.

Those layers (server-error and exception middleware, the router trying each route in turn) run
for every command and batch lookup although these endpoints handle their own errors: a few
percent of a command's or a 100-key batch's CPU (docs/decisions.md, "Lookup fast paths"). The
endpoints stay the app's own Starlette endpoints and answer exactly as they do through the app;
any other request, or a method the route does not allow, goes to the app.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Match, Route

ASGIApp = Callable[..., Any]


class DirectRoutes:
    """ASGI middleware calling the endpoint of the first route of ``app`` whose path is one of
    ``paths`` and that fully matches the request."""

    def __init__(self, app: Starlette, paths: Collection[str]) -> None:
        self.app = app
        self.routes = [r for r in app.routes if isinstance(r, Route) and r.path in paths]
        missing = set(paths) - {r.path for r in self.routes}
        if missing:
            raise ValueError(f"no routes {sorted(missing)} in the app")

    async def __call__(self, scope: dict[str, Any], receive: ASGIApp, send: ASGIApp) -> None:
        if scope["type"] == "http":
            for route in self.routes:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    request = Request({**scope, **child}, receive, send)
                    response = await route.endpoint(request)
                    await response(request.scope, receive, send)
                    return
        await self.app(scope, receive, send)
