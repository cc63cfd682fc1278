"""Requiring credentials over HTTP: commands by default, queries optionally.

:class:`RequireCredentials` is ASGI middleware (Starlette's ``Middleware(RequireCredentials,
check=..., queries=True)`` configures it): a request it protects is passed on only if
``check(request)`` says yes, else it is answered 401 ``{"error": ...}``. :func:`bearer_token`
is the built-in check (``Authorization: Bearer <token>``, compared in constant time); a
service plugs its own check, or its own middleware class, through ``Service(authentication=
...)``. The instance wraps every route in it, the hot paths included, and turns the lookup
fast paths off while queries are protected (:func:`protects_queries`).
"""

from __future__ import annotations

import hmac
import inspect
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

from starlette.middleware import Middleware
from starlette.requests import Request

from foldstream.errors import ConfigurationError
from foldstream.responses import error_answer
from foldstream.settings import Settings

#: Paths answered without credentials unless configured otherwise: probes and scrapers.
OPEN_PATHS = ("/health", "/ready", "/metrics")
#: The pages' own files (``/docs``, ``/ui``): static, holding no data, always open. What they
#: show comes from the routes they call, which need credentials like any other request.
PAGE_PREFIXES = ("/docs", "/ui")
_PAGE_DATA = "/ui/api/"
Check = Callable[[Request], "bool | Awaitable[bool]"]
ASGIApp = Callable[..., Any]


class RequireCredentials:
    """Answers 401 to a protected request unless ``check(request)`` (sync or async) is true.

    Protected: ``/commands/...`` and ``/stores/{store}/rebuilds`` always, every other path
    when ``queries`` is true, never one of ``open_paths`` (exact paths) nor the pages' files
    (:func:`is_page_file`).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        check: Check,
        queries: bool = False,
        open_paths: Collection[str] = OPEN_PATHS,
        scheme: str = "Bearer",
    ) -> None:
        self.app = app
        self.check = check
        self.queries = queries
        self.open_paths = frozenset(open_paths)
        self.refusal = error_answer(
            401,
            "this request needs credentials: send the header 'Authorization: "
            f"{scheme} <credentials>'",
            [(b"www-authenticate", f'{scheme} realm="foldstream"'.encode("latin-1"))],
        )

    def protects(self, path: str) -> bool:
        if path in self.open_paths or is_page_file(path):
            return False
        return self.queries or path.startswith("/commands/") or is_rebuild(path)

    async def __call__(self, scope: dict[str, Any], receive: ASGIApp, send: ASGIApp) -> None:
        if scope["type"] == "http" and self.protects(scope["path"]):
            allowed = self.check(Request(scope, receive))
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                status, headers, body = self.refusal
                headers = [*headers, (b"content-length", b"%d" % len(body))]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def is_rebuild(path: str) -> bool:
    """Whether ``path`` asks for a rebuild (protected as commands are)."""
    return path.startswith("/stores/") and path.rstrip("/").endswith("/rebuilds")


def is_page_file(path: str) -> bool:
    """Whether ``path`` is one of the files of the ``/docs`` or ``/ui`` pages."""
    return not path.startswith(_PAGE_DATA) and any(
        path == prefix or path.startswith(f"{prefix}/") for prefix in PAGE_PREFIXES
    )


def bearer_token(token: str) -> Check:
    """A check accepting requests with ``Authorization: Bearer <token>`` (constant time)."""
    if not token or not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigurationError("the bearer token must be non-empty printable text, no spaces")
    expected = f"Bearer {token}".encode()

    def check(request: Request) -> bool:
        given = request.headers.get("authorization", "").encode("latin-1", "replace")
        return hmac.compare_digest(given, expected)

    return check


def read_token(path: Path) -> str:
    """The bearer token in the file at ``path`` (surrounding whitespace dropped)."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the auth token file {path}: {exc}") from exc
    if not token:
        raise ConfigurationError(f"the auth token file {path} is empty")
    return token


def configured(settings: Settings, plugged: Check | Middleware | None) -> list[Middleware]:
    """The middleware requiring credentials on an instance: the bearer token of ``settings``
    (if any), then what the service ``plugged`` (a check, or a middleware of its own)."""
    layers = []
    token = settings.auth_token
    if token is None and settings.auth_token_file is not None:
        token = read_token(settings.auth_token_file)
    queries, open_paths = settings.auth_queries, settings.auth_open_paths
    if token is not None:
        check = bearer_token(token)
        layers.append(
            Middleware(RequireCredentials, check=check, queries=queries, open_paths=open_paths)
        )
    if isinstance(plugged, Middleware):
        layers.append(plugged)
    elif plugged is not None:
        if not callable(plugged):
            raise ConfigurationError(
                f"Service(authentication=...) must be a check or a Middleware, got {plugged!r}"
            )
        layers.append(
            Middleware(RequireCredentials, check=plugged, queries=queries, open_paths=open_paths)
        )
    return layers


def protects_queries(middleware: Middleware) -> bool:
    """Whether ``middleware`` may require credentials for lookups: a
    :class:`RequireCredentials` configured so, and any other middleware class (which the
    instance cannot see into)."""
    if middleware.cls is RequireCredentials:
        return bool(middleware.kwargs.get("queries", False))
    return True


def wrap(app: ASGIApp, middleware: Collection[Middleware]) -> ASGIApp:
    """``app`` inside ``middleware``, the first one outermost (as Starlette orders them)."""
    for layer in reversed(list(middleware)):
        app = layer.cls(app, *layer.args, **layer.kwargs)
    return app
