"""The one shape of every HTTP error foldstream answers: ``{"error": "<reason>"}``."""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)
