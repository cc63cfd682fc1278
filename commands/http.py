"""HTTP routes of the command side: ``POST /commands/{aggregate}/{aggregate_id}/{command}``."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.commands.arguments import InvalidArguments
from foldstream.commands.handler import CommandHandler
from foldstream.commands.idempotency import IdempotencyKeyReused, idempotency_key
from foldstream.commands.outcomes import UnknownCommand, VersionConflict
from foldstream.commands.unreplayable import AggregateUnreplayable
from foldstream.domain import DomainRuleViolation
from foldstream.domain.snapshots import UnstorableAggregate
from foldstream.errors import BrokerUnavailable, InvalidRequest, NotOwner, RecordTooLarge
from foldstream.http_input import InputLimits, count, last
from foldstream.responses import error_response
from foldstream.route_params import COMMAND
from foldstream.routing import HOPS_PARAM, Locator, Redirect, Unavailable, redirect, unavailable
from foldstream.tokens import token_for

_PREFIX = b"/commands/"
#: On the answer to a command whose first attempt's outcome it repeats (nothing appended now).
REPLAYED_HEADER = "Idempotent-Replayed"
#: Renders as :class:`JSONResponse` does (the same bytes), without making an encoder per answer.
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def expected_version(request: Request) -> int | None:
    """The version the client expects: ``?expected_version=N`` and/or ``If-Match: N``.

    ``If-Match`` may also be the strong ETag form ``"N"``. Raises :class:`InvalidArguments`
    for anything else (a count of more than 64 bits included), or when the two disagree.
    """
    scope = request.scope
    if not scope["query_string"] and all(name != b"if-match" for name, _ in scope["headers"]):
        return None  # neither given (most commands): no query string or headers to parse
    given = {
        name: value
        for name, value in (
            ("expected_version", request.query_params.get("expected_version")),
            ("If-Match", request.headers.get("if-match")),
        )
        if value is not None
    }
    versions = set()
    for name, value in given.items():
        text = value.strip()
        if name == "If-Match" and len(text) > 1 and text[0] == text[-1] == '"':
            text = text[1:-1]
        try:
            versions.add(count(name, text))
        except InvalidRequest as exc:
            raise InvalidArguments(str(exc)) from None
    if len(versions) > 1:
        raise InvalidArguments(f"expected_version and If-Match disagree: {given}")
    return versions.pop() if versions else None


def command_target(request: Request, limits: InputLimits) -> tuple[str, str, str]:
    """``(aggregate, aggregate id, command)`` from the path as sent, strictly decoded and
    within ``limits``; :class:`InvalidRequest` for a path that breaks them."""
    scope = request.scope
    raw_path: bytes = scope.get("raw_path") or request.url.path.encode()
    limits.check_url(raw_path, scope["query_string"])
    # Checked before the command is located: a misspelt expected_version is refused, never
    # run without its version check here or at the owner it would be redirected to.
    params = COMMAND.checked(scope["query_string"]) if scope["query_string"] else []
    # Checked here too, not only when redirecting: the same request is answered alike anywhere.
    count(HOPS_PARAM, last(params, HOPS_PARAM) or None)
    parts = raw_path[len(_PREFIX) :].split(b"/") if raw_path.startswith(_PREFIX) else []
    if len(parts) != 3:
        raise InvalidRequest("aggregate ids and names may not hold '/' (%2F)", status=404)
    aggregate, aggregate_id, command = parts
    return (
        limits.name(aggregate, "aggregate name"),
        limits.key(aggregate_id, "aggregate id").decode(),
        limits.name(command, "command name"),
    )


def command_routes(
    handler: Callable[[], CommandHandler],
    locator: Callable[[], Locator],
    *,
    limits: InputLimits | None = None,
) -> list[Route]:
    """Routes that send commands to the handler returned by ``handler()`` (opened in lifespan),
    refusing requests beyond ``limits``.

    A command for an aggregate whose partition another instance owns is redirected there (307,
    same path); while no instance owns it, the answer is 503 with ``Retry-After``.
    """
    bounds = limits or InputLimits()

    async def run_command(request: Request) -> Response:
        """``POST /commands/{aggregate}/{aggregate_id}/{command}`` with a JSON object of arguments.

        Optional ``?expected_version=N`` (or header ``If-Match: N``): run only if the aggregate
        is at version N (0 = no events yet). Optional ``Idempotency-Key: K``: a command the
        partition remembers under K is not run again, its first 200 is answered (with
        ``Idempotent-Replayed: true``). Answers 200 with the events and the position of the
        last one; 400 bad arguments, version, key or path, or a query parameter other than
        ``expected_version`` (and ``hops``, which redirects add); 404 unknown aggregate or command;
        409 version conflict (``current_version`` in the body) or an aggregate whose events
        could not be replayed (the record and cause in ``error``); 413 body or event too large;
        414 URL too long; 422 domain rule broken, or K used for another request; 503 with
        ``Retry-After`` when this instance does not own the aggregate's partition
        (``partition`` in the body) or Kafka failed. Nothing is appended unless the answer is
        200, except after a 503 naming an unknown outcome: resend with the same K to learn it.
        """
        try:
            aggregate, aggregate_id, command = command_target(request, bounds)
        except InvalidRequest as exc:
            return error_response(exc.status, str(exc))
        commands = handler()
        partition = commands.partition_of(aggregate_id)
        location = locator().locate(commands.topic, partition)
        if isinstance(location, Redirect):
            return redirect(request, location)
        if isinstance(location, Unavailable):
            return unavailable(location)
        try:
            version = expected_version(request)
            key = idempotency_key(request.headers.getlist("idempotency-key"))
            body = await bounds.read_body(request)
            arguments = bounds.load_json(body) if body.strip() else {}
            result = await handler().handle(
                aggregate, aggregate_id, command, arguments, version, idempotency_key=key
            )
        except COMMAND_ERRORS as exc:
            return command_error(exc)
        answer = {
            "events": result.events,
            "position": {"partition": result.partition, "offset": result.offset},
            "token": token_for(commands.topic, result.partition, result.offset),
        }
        headers = {REPLAYED_HEADER: "true"} if result.remembered else None
        return Response(
            _JSON.encode(answer).encode(), media_type="application/json", headers=headers
        )

    return [Route("/commands/{aggregate}/{aggregate_id}/{command}", run_command, methods=["POST"])]


#: The status of each error a command may end with (all others are 500s: bugs).
STATUS_OF: dict[type[Exception], int] = {
    InvalidArguments: 400,
    UnknownCommand: 404,
    VersionConflict: 409,
    AggregateUnreplayable: 409,
    RecordTooLarge: 413,
    DomainRuleViolation: 422,
    UnstorableAggregate: 422,
    IdempotencyKeyReused: 422,
    NotOwner: 503,
    BrokerUnavailable: 503,
}
COMMAND_ERRORS: tuple[type[Exception], ...] = (InvalidRequest, *STATUS_OF)


def command_error(exc: Exception) -> JSONResponse:
    """The answer to a command that ended with ``exc`` (one of :data:`COMMAND_ERRORS`): its
    status, ``Retry-After`` on a 503, and the fields a client acts on (the versions of a
    conflict, the partition nobody here owns)."""
    if isinstance(exc, InvalidRequest):
        return error_response(exc.status, str(exc))
    status = next(s for kind, s in STATUS_OF.items() if isinstance(exc, kind))
    headers = {"Retry-After": "1"} if status == 503 else None
    if isinstance(exc, VersionConflict):
        return _error(status, exc, expected_version=exc.expected, current_version=exc.current)
    if isinstance(exc, NotOwner):
        return _error(status, exc, headers, partition=exc.partition)
    if isinstance(exc, IdempotencyKeyReused):
        return _error(status, exc, idempotency_key=exc.key)
    return _error(status, exc, headers)


def _error(
    status: int, exc: Exception, headers: dict[str, str] | None = None, **fields: object
) -> JSONResponse:
    """:func:`error_response` with more fields beside ``error``."""
    return JSONResponse({"error": str(exc), **fields}, status_code=status, headers=headers)
