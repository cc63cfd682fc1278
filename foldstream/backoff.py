"""Backoff for work retried by a loop that also does other work (a partition's takeover, a
command partition's replay, the leader's role): the loop asks :meth:`Backoff.due` instead of
sleeping, so one failing item never holds up the others. The delays are tenacity's."""

from __future__ import annotations

from dataclasses import dataclass, field

from tenacity import wait_random_exponential
from tenacity.wait import wait_base

#: The longest wait between two attempts: a fault that ends is recovered from within this.
MAX_DELAY_S = 5.0


@dataclass
class _Attempts:
    """What tenacity's wait strategies read of a retry: the number of the attempt that failed."""

    attempt_number: int = 0


@dataclass
class Backoff:
    """Consecutive failures of one piece of work and when it may be tried again."""

    wait: wait_base = field(
        default_factory=lambda: wait_random_exponential(multiplier=0.1, max=MAX_DELAY_S)
    )
    failures: int = 0
    retry_at: float = 0.0

    def failed(self, now: float) -> float:
        """Count a failure at ``now``; returns the delay before the next attempt."""
        self.failures += 1
        delay = float(self.wait(_Attempts(self.failures)))  # type: ignore[arg-type]
        self.retry_at = now + delay
        return delay

    def due(self, now: float) -> bool:
        return now >= self.retry_at

    def reset(self) -> None:
        self.failures = 0
        self.retry_at = 0.0
