"""Steps for an owner that stops without dying and comes back after the cluster gave its
partitions away, writing to their changelogs for a moment before it learns so::

    When the owner of "p-0" in store "stock" is paused mid-fold until others wrote to its partitions
    Then every copy of store "stock" holds the fold of its partition's events
    Then the paused instance gave its partitions of store "stock" up on resuming

The pause (SIGSTOP) stops the instance's own process, as a long garbage-collection pause or a
starved process would: its heartbeats and its store host stop, while Spark goes on planning
micro-batches whose tasks wait for the store host. When the process resumes, those tasks fold
and write their changelog records before the instance has learnt that it lost the partitions.

The second waits until every member's copies (active and standby) have reached the end of
their source partitions, then compares each, key by key, with a plain-Python fold.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from typing import Any

import pytest
from pytest_bdd import parsers, then, when

from foldstream.changelog import EPOCH_HEADER
from foldstream.domain import EventRecord
from foldstream.kafka import read_to_end
from foldstream.process import InstanceProcess, wait_cluster_stable
from foldstream.state import RocksDBReader, partition_path
from foldstream.testing.cluster_steps import ClusterState, Store, cluster_view, owner_in
from foldstream.testing.steps import WAIT, ScenarioState, _source, service_of, wait_until

#: Changelog records an owner writes from the writer's events before it is paused: it is then
#: folding them, micro-batch after micro-batch.
FOLDING = 200


#: Pauses tried before the scenario gives up on a late write: whether tasks waiting for the
#: paused store host write before their instance gives its partitions up is a race, and a late
#: write needs the pause to catch a task before it read its partition's values (a task reads
#: every partition first, then waits for the changelog's acknowledgements and commits: most of
#: its time is past that point).
PAUSES = 6
#: How long after the resume the paused owner's late records may take to land.
LATE_WITHIN_S = 10.0


@when(
    parsers.parse(
        'the owner of "{key}" in store "{store}" is paused mid-fold until others wrote to its '
        "partitions"
    )
)
def pause_owner(
    cluster_state: ClusterState, scenario_state: ScenarioState, key: str, store: str
) -> None:
    """Pause the owner of ``key`` (see :func:`_pause_once`) until it writes late: again, the
    new owner this time, when it gave its partitions up before its waiting tasks wrote."""
    assert scenario_state.writer is not None and scenario_state.writer.is_alive(), (
        "pause an owner while a writer appends, or it has nothing to write late"
    )
    for _ in range(PAUSES):
        members = cluster_state.live()
        _pause_once(cluster_state, members, key, store)
        deadline = time.monotonic() + LATE_WITHIN_S
        while time.monotonic() < deadline:
            if _changelog_epochs(members[0], store, Store.of(members[0], store).partitions)[1]:
                return
            time.sleep(0.2)
    pytest.fail(f"no changelog record written late after {PAUSES} pauses")


def _pause_once(
    cluster_state: ClusterState, members: list[InstanceProcess], key: str, store: str
) -> None:
    """Once the owner writes the writer's events to each of its partitions' changelogs (it is
    folding them), SIGSTOP its own process, wait until each of those partitions has changelog
    records of a newer epoch (another member took it over and folds it), then SIGCONT it."""
    where = Store.of(members[0], store)
    # After an earlier pause, the members agree again on who owns what before the next one.
    view = wait_until(
        lambda: _agreed_view(members, where, key),
        lambda: f"the members do not agree on the owner of {key!r}",
    )
    paused = next(m for m in members if m.url == owner_in(view, where, key))
    owned = [
        int(p)
        for p, entry in view["partitions"][where.topic].items()
        if entry["active"] == paused.url
    ]
    started = _changelog_epochs(paused, store, where.partitions)[2]
    wait_until(
        lambda: all(
            _changelog_epochs(paused, store, where.partitions)[2][p] > started[p] + FOLDING
            for p in owned
        ),
        lambda: f"{paused.url} is not folding the writer's events into {owned}",
    )
    before = _changelog_epochs(paused, store, where.partitions)[0]
    assert paused.process is not None
    cluster_state.victim, cluster_state.held = paused.url, owned
    cluster_state.log_offset = paused.log_path.stat().st_size
    os.kill(paused.process.pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: all(
                _changelog_epochs(paused, store, where.partitions)[0].get(p, 0) > before.get(p, 0)
                for p in owned
            ),
            lambda: (
                f"partitions {owned} of {paused.url} not taken over: "
                f"{cluster_view(next(m for m in members if m is not paused))}"
            ),
        )
    finally:
        os.kill(paused.process.pid, signal.SIGCONT)


def _agreed_view(members: list[InstanceProcess], where: Store, key: str) -> dict[str, Any] | None:
    """A member's cluster view if every member names the same live member as ``key``'s owner."""
    views = [cluster_view(member) for member in members]
    owners = {owner_in(view, where, key) for view in views}
    return views[0] if len(owners) == 1 and owners <= {m.url for m in members} else None


@then(parsers.parse('every copy of store "{store}" holds the fold of its partition\'s events'))
def copies_match_the_fold(cluster_state: ClusterState, store: str) -> None:
    """Every member's active and standby copies, once at the end of their source partition,
    hold exactly what a plain-Python fold of the partition gives (keys and values)."""
    members = cluster_state.live()
    wait_cluster_stable(members, timeout=WAIT)
    projection, topic, partitions = _source(members[0], store)
    expected: dict[int, dict[bytes, bytes | None]] = {p: {} for p in range(partitions)}
    ends: dict[int, int] = {}
    for batch in read_to_end(members[0].bootstrap, topic, partitions):
        for message in batch:
            values = expected[message.partition()]
            record = EventRecord.from_message(message)
            values[message.key()] = projection.apply(values.get(message.key()), record)
            ends[message.partition()] = message.offset()
    view = cluster_view(members[0])
    compared = 0
    for p, entry in view["partitions"][topic].items():
        holders = {entry["active"], *(s["url"] for s in entry["standbys"])}
        for member in members:
            if member.url in holders:
                _check_copy(member, store, int(p), ends.get(int(p)), expected[int(p)])
                compared += 1
    late = _changelog_epochs(members[0], store, partitions)[1]
    print(f"\ncompared {compared} copies; changelog records written late (fenced): {late}")
    assert compared >= 2 * partitions, f"not every partition has a standby copy: {view}"
    # Else the pause did not do what the scenario is about (the owner resumed too late to write).
    assert late, "the paused owner wrote no changelog record after the new owners"


def _check_copy(
    member: InstanceProcess,
    store: str,
    partition: int,
    end: int | None,
    expected: dict[bytes, bytes | None],
) -> None:
    """Once ``member``'s copy of the partition has folded up to ``end``, its values are
    ``expected``."""
    path = partition_path(member.state_dir, store, partition)
    wait_until(
        lambda: _applied_offset(path) == end,
        lambda: (
            f"{member.url}'s copy of {store}/{partition} is at {_applied_offset(path)}, "
            f"the source at {end}"
        ),
    )
    with RocksDBReader(path) as copy:
        wrong = {k: (copy.get(k), v) for k, v in expected.items() if copy.get(k) != v}
    examples = ", ".join(
        f"{k!r}: {got!r}, not {want!r}" for k, (got, want) in list(wrong.items())[:3]
    )
    assert not wrong, (
        f"{member.url}'s copy of {store}/{partition}: {len(wrong)} keys differ: {examples}"
    )


def _applied_offset(path: Any) -> int | None:
    with RocksDBReader(path) as copy:
        return copy.applied_offset()


def _changelog_epochs(
    instance: InstanceProcess, store: str, partitions: int
) -> tuple[dict[int, int], Counter[int], Counter[int]]:
    """Per partition of the store's changelog: the newest epoch, how many records carry an
    epoch below one written before them (a previous owner's late writes), and all records."""
    _, settings = service_of(instance)
    newest: dict[int, int] = {}
    late: Counter[int] = Counter()
    records: Counter[int] = Counter()
    for batch in read_to_end(instance.bootstrap, settings.changelog_topic(store), partitions):
        for message in batch:
            epoch = int(dict(message.headers() or ()).get(EPOCH_HEADER, 0))
            p = message.partition()
            records[p] += 1
            if epoch < newest.get(p, 0):
                late[p] += 1
            newest[p] = max(newest.get(p, 0), epoch)
    return newest, late, records


@then(parsers.parse('the paused instance gave its partitions of store "{store}" up on resuming'))
def gave_up_after_pause(cluster_state: ClusterState, store: str) -> None:
    """After resuming, it stopped folding every partition it held when paused. Whichever of its
    threads gets there first: the one noticing the pause itself ("giving up" everything), the one
    seeing a newer owner, or the one applying the assignment that moved the partitions."""
    paused = next(m for m in cluster_state.live() if m.url == cluster_state.victim)

    def released() -> bool:
        with paused.log_path.open() as log:
            log.seek(cluster_state.log_offset)
            text = log.read()
        if "longer than the session timeout: giving up" in text or "newer owner" in text:
            return True
        folded = re.findall(rf"projection {re.escape(store)} processes \[([\d, ]*)\]", text)
        return any(
            not {int(p) for p in found.split(",") if p} & set(cluster_state.held)
            for found in folded
        )

    wait_until(
        released,
        lambda: (
            f"{paused.url} did not give up {cluster_state.held} after the pause; its log since:"
            f"\n{paused.log_tail()}"
        ),
    )
