"""``foldstream versions URL STORE``: a store's versions, and a progress bar while a new one
is built (offsets folded of the source topic's total, rate, time left), until it answers.

Exits 0 once the newest version declared answers the store's queries, 1 when ``--timeout``
passes first, 2 when the store does not exist or no instance answers (one ``error:`` line).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from foldstream.api_models import StoreEntry
from foldstream.client import FoldstreamClient

POLL_S = 0.5


def version_table(store: StoreEntry) -> Table:
    table = Table("version", "state", "folded", "behind", "total", title=f"store {store.name}")
    for version in store.versions:
        table.add_row(
            str(version.version),
            version.state,
            *(
                "-" if n is None else f"{n:,}"
                for n in (version.folded, version.behind, version.total)
            ),
        )
    return table


def _entry(client: FoldstreamClient, name: str) -> StoreEntry | None:
    return next((s for s in client.stores().stores if s.name == name), None)


def _newest_serves(store: StoreEntry) -> bool:
    return not store.versions or store.version == max(v.version for v in store.versions)


def _progress() -> Progress:
    return Progress(
        TextColumn("version {task.fields[version]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("offsets, {task.fields[rate]}/s"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )


def _follow(client: FoldstreamClient, name: str, progress: Progress, deadline: float) -> bool:
    """Update ``progress`` until the newest version serves (True) or ``deadline`` (False)."""
    task: TaskID | None = None
    while time.monotonic() < deadline:
        store = _entry(client, name)
        if store is None:
            return False  # gone: the instance asked now runs other code
        if _newest_serves(store):
            return True
        newest = store.versions[-1]
        if newest.folded is not None and newest.total is not None:
            if task is None:
                task = progress.add_task("", total=newest.total, version=newest.version, rate=0)
            progress.update(task, completed=newest.folded, total=newest.total)
            speed = progress.tasks[task].speed or 0
            progress.update(task, rate=f"{speed:,.0f}")
        time.sleep(POLL_S)
    return False


def watch_versions(url: str, name: str, *, token: str | None, timeout: float) -> int:
    """Print ``name``'s versions, follow a build until the newest serves; the exit code."""
    console = Console()
    with FoldstreamClient(url, token=token, retry_timeout=10.0) as client:
        store = _entry(client, name)
        if store is None:
            console.print(f"no store named {name!r}: {[s.name for s in client.stores().stores]}")
            return 2
        console.print(version_table(store))
        if _newest_serves(store):
            console.print(f"version {store.version} answers {name!r}")
            return 0
        with _progress() as progress:
            done = _follow(client, name, progress, time.monotonic() + timeout)
        store = _entry(client, name) or store
        console.print(version_table(store))
    if not done:
        console.print(f"version {store.versions[-1].version} still building after {timeout:.0f}s")
        return 1
    console.print(f"version {store.version} answers {name!r}")
    return 0
