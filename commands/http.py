"""HTTP routes of the command side: ``POST /commands/{aggregate}/{aggregate_id}/{command}``."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from foldstream.commands.handler import CommandHandler, InvalidArguments, UnknownCommand
from foldstream.domain import DomainRuleViolation
from foldstream.errors import BrokerUnavailable
from foldstream.responses import error_response


def command_routes(handler: Callable[[], CommandHandler]) -> list[Route]:
    """Routes that send commands to the handler returned by ``handler()`` (opened in lifespan)."""

    async def run_command(request: Request) -> JSONResponse:
        params = request.path_params
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
