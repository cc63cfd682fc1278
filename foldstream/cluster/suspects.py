"""Which members are live, and which of them are suspects, from how long each has been silent.

A member silent (in this member's view of the cluster topic: :mod:`.map`) for ``liveness_s`` is
no longer a member; one silent for ``suspect_s`` (less) is a *suspect*: still a member, keeping
its partitions until the session timeout, but no instance sends a client to it. A dead member is
a suspect for the rest of the session timeout, so clients meet 503s (or a standby copy) then,
never a redirect into a refused connection; a member whose heartbeats were only late clears as
soon as one is read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger(__name__)

Standing = tuple[frozenset[str], frozenset[str]]
"""The ids of the live members, and of the suspects among them."""


class Suspicion:
    """The standing of the members from their silences, and what changed since last told."""

    def __init__(self, member_id: str, *, liveness_s: float, suspect_s: float) -> None:
        self.member_id = member_id
        self.liveness_s = liveness_s
        self.suspect_s = min(suspect_s, liveness_s)
        self.told: Standing = (frozenset(), frozenset())
        self.suspicions = 0  # members that turned suspect, ever (a metric)

    def standing(self, silent: Mapping[str, float]) -> Standing:
        """From ``silent``: each other member's silence in seconds (this member is live)."""
        live = frozenset(m for m, s in silent.items() if s < self.liveness_s)
        suspects = frozenset(m for m in live if silent[m] >= self.suspect_s)
        return live | {self.member_id}, suspects

    def changed(self, silent: Mapping[str, float]) -> bool:
        """Whether a member turned suspect, cleared or dropped out since last asked: silence
        grows without any record being read, so no record says so. Logs each suspicion."""
        standing = self.standing(silent)
        if standing == self.told:
            return False
        before, self.told = self.told[1], standing
        for member_id in sorted(standing[1] - before):
            self.suspicions += 1
            log.warning(
                "member %s is a suspect: silent for %.1fs (suspect after %.1fs); no client is sent "
                "to it until it beats again (healthy members suspected often are starved of CPU, "
                "or the broker is slow: raise --suspect-after-ms)",
                member_id,
                silent[member_id],
                self.suspect_s,
            )
        for member_id in sorted(before - standing[1]):
            now = "beats again" if member_id in standing[0] else "is no longer a member"
            log.info("member %s is no longer a suspect: it %s", member_id, now)
        return True
