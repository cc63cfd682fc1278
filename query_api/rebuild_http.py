"""``POST /stores/{store}/rebuilds``: rebuild the version of a store that answers, beside it
(:mod:`foldstream.cluster.rebuilds`). Protected as commands are (:mod:`foldstream.auth`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from foldstream.cluster.rebuilds import RebuildConflict, RebuildRefused, Rebuilds
from foldstream.errors import StoreNotFound
from foldstream.responses import error_response
from foldstream.route_params import REBUILD, refusing_unknown

#: A declared store's name (no version mark), bounded.
_STORE = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


def rebuild_routes(rebuilds: Callable[[], Rebuilds]) -> list[Route]:
    """The route, over the member's :class:`Rebuilds` (``rebuilds()``, opened in the
    lifespan)."""

    async def rebuild(request: Request) -> Response:
        store = request.path_params["store"]
        if not _STORE.match(store):
            return error_response(400, "a store name is 1 to 200 letters, digits, _ or -")
        if request.headers.get("content-length", "0") not in ("", "0"):
            return error_response(400, "a rebuild request takes no body")
        try:
            asked = await asyncio.to_thread(rebuilds().request, store)
        except StoreNotFound as exc:
            return error_response(404, str(exc))
        except RebuildConflict as exc:
            return error_response(409, str(exc))
        except RebuildRefused as exc:
            return error_response(422, str(exc))
        return JSONResponse(asked.model_dump(), status_code=202)

    return [Route("/stores/{store}/rebuilds", refusing_unknown(REBUILD, rebuild), methods=["POST"])]
