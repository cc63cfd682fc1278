"""A service whose projections fail on purpose, for testing how poison records and failed
micro-batches are handled.

Its three stores keep the latest value of each key of ``flaky.records`` (JSON), each with its
own ``on_error``: ``flaky`` dead-letters (the default), ``flaky_skipped`` skips and
``flaky_stopped`` stops. A value ``{"fail": {"<store>": N}, "marker": "<path>"}`` makes folding
it into the stores it names fail N times first: every attempt appends a line to the file
``<path>.<store>``, so a test knows how often it was tried. A value ``{"unavailable":
{"<store>": "<path>"}}`` makes the store's fold raise
:class:`~foldstream.errors.BrokerUnavailable` (an infrastructure error, not the record's) for
as long as the file ``<path>`` exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable
from foldstream.projections import LatestValue
from foldstream.service import Service

TOPIC = "flaky.records"


@dataclass(frozen=True)
class FailingLatestValue(LatestValue):
    """:class:`LatestValue` that raises for the planned number of attempts of a record."""

    def apply(self, current: bytes | None, record: EventRecord) -> bytes | None:
        plan = _plan(record)
        outage = plan.get("unavailable", {}).get(self.store)
        if outage is not None and Path(outage).exists():
            raise BrokerUnavailable(f"unavailable on purpose while {outage} exists")
        fail_times = plan.get("fail", {}).get(self.store)
        if fail_times is not None:
            marker = Path(f"{plan['marker']}.{self.store}")
            with marker.open("a") as attempts:
                attempts.write("attempt\n")
            attempt = len(marker.read_text().splitlines())
            if attempt <= fail_times:
                raise RuntimeError(f"failing on purpose: attempt {attempt} of {fail_times}")
        return super().apply(current, record)


def _plan(record: EventRecord) -> dict[str, Any]:
    try:
        plan = json.loads(record.value) if record.value else None
    except ValueError:
        return {}
    return plan if isinstance(plan, dict) else {}


service = Service(
    name="flaky",
    projections=[
        FailingLatestValue("flaky", topic=TOPIC),
        FailingLatestValue("flaky_skipped", topic=TOPIC, on_error="skip"),
        FailingLatestValue("flaky_stopped", topic=TOPIC, on_error="stop"),
    ],
)
