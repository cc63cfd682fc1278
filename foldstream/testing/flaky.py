"""A service whose projection fails on purpose, for testing how failed micro-batches recover.

Its store ``flaky`` keeps the latest value of each key of ``flaky.records`` (JSON), except that a
value ``{"fail_times": N, "marker": "<path>"}`` makes folding it fail N times first: every
attempt appends a line to the marker file, so a test knows how often it was tried.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from foldstream.domain.records import EventRecord
from foldstream.projections import LatestValue
from foldstream.service import Service

TOPIC = "flaky.records"


@dataclass(frozen=True)
class FailingLatestValue(LatestValue):
    """:class:`LatestValue` that raises for the planned number of attempts of a record."""

    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        plan = json.loads(record.value) if record.value else None
        if isinstance(plan, dict) and "fail_times" in plan:
            marker = Path(plan["marker"])
            with marker.open("a") as attempts:
                attempts.write("attempt\n")
            attempt = len(marker.read_text().splitlines())
            if attempt <= plan["fail_times"]:
                raise RuntimeError(f"failing on purpose: attempt {attempt} of {plan}")
        return super().apply(current, record)


service = Service(name="flaky", projections=[FailingLatestValue("flaky", topic=TOPIC)])
