"""A failed streaming query: how long to wait before restarting it, and what its error was."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tenacity import RetryCallState, Retrying, wait_exponential

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

#: The wait before restarting a failed query: doubling with each failure in a row, from the
#: first to the longest (short enough that a query failed by a broker outage folds again a few
#: seconds after the broker is back).
RESTART_WAIT_MIN_S = 1.0
RESTART_WAIT_MAX_S = 5.0

_restart_wait = wait_exponential(multiplier=RESTART_WAIT_MIN_S, max=RESTART_WAIT_MAX_S)


def restart_delay(failures: int) -> float:
    """Seconds to wait before restarting a query after its ``failures``-th failure in a row
    (tenacity's ``wait_exponential``)."""
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = failures
    return float(_restart_wait(state))


@dataclass
class Failing:
    """A query that failed: how often in a row, the last error, when its next restart is due,
    and the query that failed last (a restart replaces it)."""

    failures: int
    error: str
    restart_at: float
    query: StreamingQuery


#: The line a Python traceback ends with: the exception raised, whatever its class's name.
_RAISED = re.compile(r"Traceback \(most recent call last\):\n(?:[ \t].*\n)+(\S.*)$", re.MULTILINE)
_PYTHON_ERROR = re.compile(r"^\w[\w.]*(?:Error|Exception): .*$", re.MULTILINE)


def error_summary(error: object) -> str:
    """The Python error inside a Spark error (else its first line), without stack traces."""
    text = str(error).strip()
    raised = _RAISED.search(text) or _PYTHON_ERROR.search(text)
    if raised is not None:
        return raised.group(raised.lastindex or 0)
    return text.splitlines()[0] if text else repr(error)
