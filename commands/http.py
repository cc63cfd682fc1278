"""HTTP routes of the command side: ``POST /commands/{aggregate}/{aggregate_id}/{command}``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.commands.handler import (
    AggregateUnreplayable,
    CommandHandler,
    InvalidArguments,
    UnknownCommand,
    VersionConflict,
)
from foldstream.domain import DomainRuleViolation
from foldstream.errors import BrokerUnavailable, NotOwner
from foldstream.responses import error_response
from foldstream.routing import Locator, Redirect, Unavailable, redirect, unavailable

_VERSION = re.compile(r'([0-9]+)|"([0-9]+)"')


def expected_version(request: Request) -> int | None:
    """The version the client expects: ``?expected_version=N`` and/or ``If-Match: N``.

    ``If-Match`` may also be the strong ETag form ``"N"``. Raises :class:`InvalidArguments`
    for anything else, or when the two disagree.
    """
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
        matched = _VERSION.fullmatch(value.strip())
        if matched is None:
            raise InvalidArguments(f"{name} must be a non-negative integer, got {value!r}")
        versions.add(int(matched.group(1) or matched.group(2)))
    if len(versions) > 1:
        raise InvalidArguments(f"expected_version and If-Match disagree: {given}")
    return versions.pop() if versions else None


def command_routes(
    handler: Callable[[], CommandHandler], locator: Callable[[], Locator]
) -> list[Route]:
    """Routes that send commands to the handler returned by ``handler()`` (opened in lifespan).

    A command for an aggregate whose partition another instance owns is redirected there (307,
    same path); while no instance owns it, the answer is 503 with ``Retry-After``.
    """

    async def run_command(request: Request) -> Response:
        """``POST /commands/{aggregate}/{aggregate_id}/{command}`` with a JSON object of arguments.

        Optional ``?expected_version=N`` (or header ``If-Match: N``): run only if the aggregate
        is at version N (0 = no events yet). Answers 200 with the events and the position of
        the last one; 400 bad arguments or version; 404 unknown aggregate or command; 409
        version conflict (``current_version`` in the body) or an aggregate whose events could
        not be replayed (the record and cause in ``error``); 422 domain rule broken; 503 with
        ``Retry-After`` when this instance does not own the aggregate's partition (``partition``
        in the body) or Kafka failed. Nothing is appended unless the answer is 200, except after
        a 503 naming an unknown outcome: resend with ``expected_version`` to stay safe.
        """
        params = request.path_params
        commands = handler()
        partition = commands.partition_of(params["aggregate_id"])
        location = locator().locate(commands.topic, partition)
        if isinstance(location, Redirect):
            return redirect(request, location)
        if isinstance(location, Unavailable):
            return unavailable(location)
        body = await request.body()
        try:
            arguments = json.loads(body) if body.strip() else {}
        except ValueError as exc:
            return error_response(400, f"malformed JSON: {exc}")
        try:
            result = await handler().handle(
                params["aggregate"],
                params["aggregate_id"],
                params["command"],
                arguments,
                expected_version=expected_version(request),
            )
        except UnknownCommand as exc:
            return error_response(404, str(exc))
        except InvalidArguments as exc:
            return error_response(400, str(exc))
        except VersionConflict as exc:
            return _error(409, exc, expected_version=exc.expected, current_version=exc.current)
        except AggregateUnreplayable as exc:
            return error_response(409, str(exc))
        except DomainRuleViolation as exc:
            return error_response(422, str(exc))
        except NotOwner as exc:
            return _error(503, exc, {"Retry-After": "1"}, partition=exc.partition)
        except BrokerUnavailable as exc:
            return error_response(503, str(exc), headers={"Retry-After": "1"})
        return JSONResponse(
            {
                "events": result.events,
                "position": {"partition": result.partition, "offset": result.offset},
            }
        )

    return [Route("/commands/{aggregate}/{aggregate_id}/{command}", run_command, methods=["POST"])]


def _error(
    status: int, exc: Exception, headers: dict[str, str] | None = None, **fields: object
) -> JSONResponse:
    """:func:`error_response` with more fields beside ``error``."""
    return JSONResponse({"error": str(exc), **fields}, status_code=status, headers=headers)
