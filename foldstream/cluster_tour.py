"""The cluster part of ``make demo``: a redirect, a standby read and a failover, shown live.

Runs against instances started by the demo (child processes on loopback) and prints what each
step observed; returns False when an answer was wrong or a step did not happen.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import tenacity
from rich.console import Console
from rich.table import Table

from foldstream.process import InstanceProcess, http

FAILOVER_TIMEOUT_S = 60.0


def _wait_answered(
    urls: Sequence[str], store: str, expected: Mapping[str, Any], timeout: float
) -> bool:
    deadline = time.monotonic() + timeout
    pending = {(url, key) for url in urls for key in expected}
    while pending and time.monotonic() < deadline:
        for url, key in sorted(pending):
            try:
                status, body = http("GET", f"{url}/stores/{store}/keys/{key}", timeout=5)
            except OSError:
                continue  # sent to the dead owner, which the map still names for a moment
            if status == 200 and body["value"] == expected[key]:
                pending.discard((url, key))
        if pending:
            time.sleep(0.05)
    return not pending


def tour(
    console: Console,
    instances: Sequence[InstanceProcess],
    store: str,
    expected: Mapping[str, Any],
) -> bool:
    """Show routing, a standby read and a kill -9 failover over ``store``'s ``expected`` values."""
    key = sorted(expected)[0]
    path = f"/stores/{store}/keys/{key}"
    _, owners = http("GET", f"{instances[0].url}/stores/{store}/owners/{key}")
    by_url = {i.url: i for i in instances}
    owner = by_url[owners["active"]]
    stranger = next(i for i in instances if i is not owner)
    table = Table(title="the cluster at work", show_lines=True)
    table.add_column("step")
    table.add_column("what happened")
    ok = True

    status, moved = http("GET", f"{stranger.url}{path}", follow_redirects=False)
    status_after, body = http("GET", f"{stranger.url}{path}")
    redirected = status == 307 and moved["location"].startswith(owner.url)
    ok &= redirected and status_after == 200 and body["value"] == expected[key]
    table.add_row(
        "redirect-on-miss",
        f"GET {stranger.url}{path} → {status} Location {moved.get('location')}\n"
        f"followed: {status_after}, served by {body.get('served_by')}",
    )

    standby_urls = [s["url"] for s in owners["standbys"]]
    if standby_urls:
        status, served = _standby_read(f"{standby_urls[0]}{path}?max_lag=0")
        ok &= status == 200 and served.get("role") == "standby"
        table.add_row(
            "standby read (?max_lag=0)", f"{standby_urls[0]} → {status}, served by {served}"
        )
    else:
        ok = False
        table.add_row("standby read", "[red]no standby copy of the partition")

    survivors = [i for i in instances if i is not owner]
    killed_at = time.monotonic()
    owner.kill()
    recovered = _wait_answered([s.url for s in survivors], store, expected, FAILOVER_TIMEOUT_S)
    took = time.monotonic() - killed_at
    ok &= recovered
    _, now = http("GET", f"{survivors[0].url}/stores/{store}/owners/{key}")
    table.add_row(
        "failover (kill -9 of the owner)",
        f"killed {owner.url}; every key answered again by the survivors after {took:.1f}s"
        if recovered
        else f"[red]keys still unanswered after {took:.1f}s",
    )
    table.add_row("new owner", f"{key} → {now.get('active')}")
    console.print(table)
    return ok


def _standby_read(url: str) -> tuple[int, dict[str, Any]]:
    """The status and ``served_by`` of ``url``, asked again for up to 10 s until a standby
    answers: the standby applies the changelog's last batches first."""

    def read() -> tuple[int, dict[str, Any]]:
        status, body = http("GET", url)
        return status, body.get("served_by", {}) if isinstance(body, dict) else {}

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda answer: answer[1].get("role") != "standby"),
        stop=tenacity.stop_after_delay(10),
        wait=tenacity.wait_fixed(0.05),
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else (0, {}),
    )
    return retrying(read)
