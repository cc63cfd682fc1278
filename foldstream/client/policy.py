"""The clients' retry policy (tenacity): retry :class:`~.flows.Retry` until the deadline,
waiting what each asked for (``Retry-After``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tenacity import RetryCallState, retry_if_exception_type, stop_after_delay

from foldstream.client.errors import OutcomeUnknown, Unavailable
from foldstream.client.flows import Attempts, Retry

#: The shortest wait between attempts.
MIN_WAIT_S = 0.05


def wait_asked(state: RetryCallState) -> float:
    """What the failed attempt's :class:`Retry` asked for, at least :data:`MIN_WAIT_S`."""
    outcome = state.outcome
    failure = outcome.exception() if outcome is not None else None
    return max(MIN_WAIT_S, failure.after if isinstance(failure, Retry) else 0.0)


def retry_policy(timeout: float) -> dict[str, Any]:
    """Keyword arguments of tenacity's ``Retrying`` / ``AsyncRetrying``."""
    return {
        "retry": retry_if_exception_type(Retry),
        "wait": wait_asked,
        "stop": stop_after_delay(timeout),
        "reraise": True,
    }


@contextlib.contextmanager
def give_up(timeout: float, attempts: Attempts | None = None) -> Iterator[None]:
    """Turns the last :class:`Retry` into :class:`Unavailable` once the deadline passed, or,
    for a command one of whose ``attempts`` may have been applied, into
    :class:`OutcomeUnknown` carrying its key."""
    try:
        yield
    except Retry as exc:
        if attempts is not None and attempts.maybe_applied:
            key = attempts.idempotency_key
            raise OutcomeUnknown(
                f"no definite answer within {timeout}s (last: {exc}); the command may have been "
                f"applied: resend it with idempotency_key={key!r} to learn its outcome",
                idempotency_key=key,
            ) from None
        raise Unavailable(f"no answer within {timeout}s; last: {exc}") from None
