"""What the client raises: one class per kind of answer a caller handles differently."""

from __future__ import annotations

from typing import Any

from foldstream.errors import FoldstreamError


class ClientError(FoldstreamError):
    """A request failed; ``status`` is the HTTP status (None when no answer came) and
    ``body`` the decoded answer."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class BadRequest(ClientError):
    """400, 413 or 414: the request breaks a rule (arguments, key, size); the message says
    which. Remedy: fix the request; the limits are in ``docs/reference/http.md``."""


class Unauthorized(ClientError):
    """401: the instance wants credentials. Remedy: pass ``token=`` to the client."""


class NotFound(ClientError):
    """404: no such store, aggregate or command. Remedy: check the names (``GET /openapi.json``)."""


class KeyNotFound(NotFound):
    """404 of a lookup: the store holds no value for the key."""


class VersionConflict(ClientError):
    """409: the aggregate is not at ``expected_version`` (``current_version`` says where it is);
    nothing was appended. Remedy: read again, decide again, resend."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message, status, body)
        fields = body if isinstance(body, dict) else {}
        self.expected_version: int | None = fields.get("expected_version")
        self.current_version: int | None = fields.get("current_version")


class Rejected(ClientError):
    """422: the command broke a domain rule; nothing was appended."""


class IdempotencyKeyReused(Rejected):
    """422: the command's ``Idempotency-Key`` named another request (another aggregate,
    command, arguments or expected version); nothing was appended. Remedy: a key names one
    command: send a new command with a new key."""


class Unavailable(ClientError):
    """No instance could answer before the client's ``retry_timeout`` ran out (503s, instances
    unreachable, keys no one owned). Remedy: retry later; check ``foldstream status URL``."""


class OutcomeUnknown(ClientError):
    """A command was sent but whether it was appended is not known: no definite answer came
    within ``retry_timeout`` (the client resent it with its ``idempotency_key`` meanwhile),
    or, from instances that do not honour the key, the connection broke after sending or
    Kafka's answer was lost. Remedy: resend it with the same ``idempotency_key`` (within the
    retention: the first outcome is answered, nothing is appended twice), or with
    ``expected_version`` (at most once)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        body: Any = None,
        idempotency_key: str | None = None,
    ) -> None:
        super().__init__(message, status, body)
        self.idempotency_key = idempotency_key


class TooManyRedirects(ClientError):
    """The members sent the request around more than the hop limit, or to a URL that is no
    member of the cluster. Remedy: check that the instances agree (``GET /cluster``)."""
