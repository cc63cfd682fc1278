"""HTTP routes of the command side: ``POST /commands/{aggregate}/{aggregate_id}/{command}``."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.commands.handler import CommandHandler, InvalidArguments, UnknownCommand
from foldstream.domain import DomainRuleViolation
from foldstream.errors import BrokerUnavailable
from foldstream.responses import error_response
from foldstream.routing import Locator, Redirect, Unavailable, redirect, unavailable


def command_routes(
    handler: Callable[[], CommandHandler], locator: Callable[[], Locator]
) -> list[Route]:
    """Routes that send commands to the handler returned by ``handler()`` (opened in lifespan).

    A command for an aggregate whose partition another instance owns is redirected there (307,
    same path); while no instance owns it, the answer is 503 with ``Retry-After``.
    """

    async def run_command(request: Request) -> Response:
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
                params["aggregate"], params["aggregate_id"], params["command"], arguments
            )
        except UnknownCommand as exc:
            return error_response(404, str(exc))
        except InvalidArguments as exc:
            return error_response(400, str(exc))
        except DomainRuleViolation as exc:
            return error_response(422, str(exc))
        except BrokerUnavailable as exc:
            return error_response(503, str(exc), headers={"Retry-After": "1"})
        return JSONResponse(
            {
                "events": result.events,
                "position": {"partition": result.partition, "offset": result.offset},
            }
        )

    return [Route("/commands/{aggregate}/{aggregate_id}/{command}", run_command, methods=["POST"])]
