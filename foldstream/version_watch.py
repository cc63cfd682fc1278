"""``foldstream versions URL STORE``: a store's versions, and a progress bar while a new one
is built (offsets folded of the source topic's total, rate, time left), until it answers.
``foldstream rebuild URL STORE`` asks for a rebuild of the version answering first
(:mod:`foldstream.cluster.rebuilds`), then follows it the same way.

Exits 0 once the newest version declared (the generation asked for) answers the store's
queries, 1 when ``--timeout`` passes first, 2 when the store does not exist, cannot be rebuilt
or no instance answers (one ``error:`` line).
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

from foldstream.api_models import StoreEntry, StoreVersion
from foldstream.client import FoldstreamClient
from foldstream.errors import StoreNotFound

POLL_S = 0.5
Rank = tuple[int, int]
"""``(version, generation)``: newer ranks higher."""


def label(version: int, generation: int) -> str:
    """``"1"``, or ``"1 rebuild 2"`` for a rebuild generation."""
    return f"{version} rebuild {generation}" if generation else str(version)


def version_table(store: StoreEntry) -> Table:
    table = Table("version", "state", "folded", "behind", "total", title=f"store {store.name}")
    for version in store.versions:
        table.add_row(
            label(version.version, version.generation),
            version.state,
            *(
                "-" if n is None else f"{n:,}"
                for n in (version.folded, version.behind, version.total)
            ),
        )
    return table


def _entry(client: FoldstreamClient, name: str) -> StoreEntry | None:
    return next((s for s in client.stores().stores if s.name == name), None)


def _serving(store: StoreEntry) -> Rank:
    return store.version, store.generation


def _newest(store: StoreEntry) -> Rank:
    return max(((v.version, v.generation) for v in store.versions), default=_serving(store))


def _building(store: StoreEntry) -> StoreVersion | None:
    return next((v for v in reversed(store.versions) if v.state == "building"), None)


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


def _follow(
    client: FoldstreamClient, name: str, target: Rank, progress: Progress, deadline: float
) -> bool:
    """Update ``progress`` until ``target`` or a newer version serves (True) or ``deadline``
    (False)."""
    task: TaskID | None = None
    while time.monotonic() < deadline:
        store = _entry(client, name)
        if store is None:
            return False  # gone: the instance asked now runs other code
        if _serving(store) >= target:
            return True
        newest = _building(store)
        if newest is not None and newest.folded is not None and newest.total is not None:
            if task is None:
                shown = label(newest.version, newest.generation)
                task = progress.add_task("", total=newest.total, version=shown, rate=0)
            progress.update(task, completed=newest.folded, total=newest.total)
            speed = progress.tasks[task].speed or 0
            progress.update(task, rate=f"{speed:,.0f}")
        time.sleep(POLL_S)
    return False


def _watch(
    console: Console, client: FoldstreamClient, name: str, target: Rank | None, timeout: float
) -> int:
    """Follow ``name`` until ``target`` (default: its newest version) answers; the exit
    code."""
    store = _entry(client, name)
    if store is None:
        raise StoreNotFound(f"no store named {name!r}: {[s.name for s in client.stores().stores]}")
    console.print(version_table(store))
    target = target or _newest(store)
    if _serving(store) < target:
        with _progress() as progress:
            _follow(client, name, target, progress, time.monotonic() + timeout)
        store = _entry(client, name) or store
        console.print(version_table(store))
    if _serving(store) < target:
        console.print(f"version {label(*target)} still building after {timeout:.0f}s")
        return 1
    console.print(f"version {label(*_serving(store))} answers {name!r}")
    return 0


def watch_versions(url: str, name: str, *, token: str | None, timeout: float) -> int:
    """Print ``name``'s versions, follow a build until the newest serves; the exit code."""
    with FoldstreamClient(url, token=token, retry_timeout=10.0) as client:
        return _watch(Console(), client, name, None, timeout)


def rebuild(url: str, name: str, *, token: str | None, timeout: float) -> int:
    """Ask for a rebuild of ``name``'s version answering, follow it until it answers; the exit
    code."""
    console = Console()
    with FoldstreamClient(url, token=token, retry_timeout=10.0) as client:
        asked = client.rebuild(name)
        console.print(
            f"rebuilding version {asked.version} of {name!r} as generation {asked.generation}"
        )
        return _watch(console, client, name, (asked.version, asked.generation), timeout)
