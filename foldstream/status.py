"""``foldstream status URL``: the cluster as one instance sees it, as tables.

Members (id, URL, readiness, the partitions each serves, restores or keeps standby copies of,
when it was last heard from, whether it is a suspect: heartbeats late, no request sent to it),
then each partition's active owner and standby copies with their lag. Exits 0 when the
assignment has settled (no suspect) and every member is ready, 1 otherwise.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from foldstream.api_models import ClusterMap, Member
from foldstream.client import ClientError, FoldstreamClient


def _partitions(by_topic: dict[str, list[int]]) -> str:
    return "; ".join(f"{topic} {sorted(ps)}" for topic, ps in sorted(by_topic.items()) if ps)


def member_table(cluster: ClusterMap, readiness: dict[str, str]) -> Table:
    table = Table(title="members", title_justify="left")
    for column in ("id", "url", "ready", "active", "standby", "restoring", "last seen"):
        table.add_column(column)
    for member in cluster.instances:
        table.add_row(
            member.id
            + (" (leader)" if member.id == cluster.leader else "")
            + (" (suspect)" if member.suspect else ""),
            member.url,
            readiness.get(member.url, "?"),
            _partitions(member.active),
            _partitions(member.standby),
            _partitions(member.restoring),
            f"{member.last_seen_s:.1f}s ago",
        )
    return table


def partition_table(cluster: ClusterMap) -> Table:
    names = {m.url: m.id for m in cluster.instances}
    stores: dict[str, list[str]] = {}
    for store, layout in cluster.stores.items():
        stores.setdefault(layout.topic, []).append(store)
    table = Table(title="partitions", title_justify="left")
    for column in ("topic", "partition", "stores", "active", "standbys (lag)"):
        table.add_column(column)
    for topic, partitions in sorted(cluster.partitions.items()):
        for number, owners in sorted(partitions.items(), key=lambda item: int(item[0])):
            standbys = ", ".join(
                f"{names.get(s.url, s.url)} ({'?' if s.lag is None else s.lag})"
                + (" suspect" if s.suspect else "")
                for s in owners.standbys
            )
            active = names.get(owners.active, owners.active) if owners.active else "none"
            if owners.suspect:
                active = f"none: {names.get(owners.suspect, owners.suspect)} is a suspect"
            table.add_row(
                topic, number, ", ".join(sorted(stores.get(topic, []))), active, standbys or "-"
            )
    return table


def _readiness(client: FoldstreamClient, member: Member) -> str:
    if member.suspect:  # it may be dead, or stand still: asking would wait for nothing
        return "suspect: heartbeats late, not asked"
    try:
        ready = client.ready(member.url)
    except ClientError as exc:
        return f"unreachable ({exc})"
    return "ready" if ready.ready else f"not ready: {ready.reason}"


def print_status(url: str, *, token: str | None, timeout: float) -> int:
    """Print the tables for the cluster ``url`` belongs to; the exit code (see the module)."""
    console = Console()
    with FoldstreamClient(url, token=token, retry_timeout=timeout) as client:
        cluster = client.cluster()
        readiness = {m.url: _readiness(client, m) for m in cluster.instances}
    settled = "settled" if cluster.settled else "NOT settled (partitions moving)"
    console.print(
        f"cluster at {url}: {len(cluster.instances)} members, assignment generation "
        f"{cluster.generation} by {cluster.leader or '-'}, {settled}"
    )
    if not cluster.view_current:
        console.print(
            "the instance asked has not read its own heartbeat back within the session timeout: "
            "this map may be out of date (is the broker reachable from it?)"
        )
    console.print(member_table(cluster, readiness))
    console.print(partition_table(cluster))
    healthy = (
        cluster.settled
        and cluster.view_current
        and all(state == "ready" for state in readiness.values())
    )
    return 0 if healthy else 1
