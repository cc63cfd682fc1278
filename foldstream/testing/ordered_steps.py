"""Sentences of the step library about ordered and windowed stores: ranges, windows, their
pages, and (on a cluster) their routing, standby reads and restores.

Loaded by :mod:`foldstream.testing.plugin` beside :mod:`foldstream.testing.steps`::

    Then the range of "c-1" in store "bookings" from "2026-05-01T08:00Z" to "2026-05-02" holds:
      | sort_key                 | value                    |
      | 2026-05-01T08:15:00.000Z | {"trip": "Paris-Lyon"}   |
    Then the windows of "sku-1" in store "sales_10m" are:
      | start                    | end                      | value          |
      | 2026-05-01T10:00:00.000Z | 2026-05-01T10:10:00.000Z | {"units": 3}   |
    Then reading the range of "c-1" in store "bookings" 40 at a time gives each entry once, in order
    Then GET "/stores/bookings/keys/c-1/range?limit=0" answers 400 saying "limit must be"
    Then the range of every key in store "bookings" is answered from every instance by its owner
    Then a standby of "c-1" answers its windows in store "trips_per_day" with max_lag 0
    Then it serves the range of its keys in store "bookings", restored from the changelog

Expected entries and windows are those of a plain-Python computation over the store's topic
(:func:`~foldstream.projections.reference.fold_topic`); "every key" is every key a producer
step of the scenario wrote. ``Then the store "s" holds a plain fold of its topic`` covers
ordered and windowed stores too (:func:`plain_fold_served`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pytest_bdd import parsers, then

from foldstream.process import InstanceProcess, http
from foldstream.projections.reference import fold_topic
from foldstream.reads import ITEMS, Read, read_all, read_path
from foldstream.testing.cluster_steps import (
    ClusterState,
    Store,
    cluster_view,
    member_ids,
    owner_in,
    wait_owner_of_some,
)
from foldstream.testing.steps import ScenarioState, _rows, _source, wait_until

READ = r"(?P<read>range|windows)"


def expected_items(instance: InstanceProcess, store: str) -> dict[str, list[Any]]:
    """``{key: entries or windows}`` of ``store`` by a plain fold of its topic."""
    projection, topic, partitions = _source(instance, store)
    return fold_topic(instance.bootstrap, projection, topic, partitions)


def plain_fold_served(instance: InstanceProcess, store: str, read: Read) -> None:
    """Every key of the store's topic is read (every page) with the items a plain fold gives
    (none for a key whose entries were deleted or whose windows all expired)."""
    expected = expected_items(instance, store)
    projection, topic, partitions = _source(instance, store)
    keys = {key.decode() for key, _ in _topic_keys(instance, topic, partitions)} | set(expected)
    assert keys, f"{topic} holds nothing to compare with"
    served: dict[str, Any] = {}

    def all_served() -> bool:
        for key in keys:
            served[key] = read_all(instance.url, store, key, read)
        return all(served[k] == (200, expected.get(k, [])) for k in keys)

    wait_until(
        all_served,
        lambda: "; ".join(
            f"{k}: served {served[k]}, fold {expected.get(k, [])}"
            for k in sorted(keys)
            if served.get(k) != (200, expected.get(k, []))
        )[:4000],
    )


def _topic_keys(instance: InstanceProcess, topic: str, partitions: int) -> list[tuple[bytes, int]]:
    from foldstream.kafka import read_to_end

    return [
        (m.key(), m.partition())
        for batch in read_to_end(instance.bootstrap, topic, partitions)
        for m in batch
        if m.key() is not None
    ]


@then(
    parsers.re(
        rf'the {READ} of "(?P<key>[^"]+)" in store "(?P<store>[\w-]+)"'
        r'(?: from "(?P<start>[^"]+)")?(?: to "(?P<end>[^"]+)")? (?:holds|are):'
    )
)
def items_are(
    instance: InstanceProcess,
    read: Read,
    key: str,
    store: str,
    start: str | None,
    end: str | None,
    datatable: list[list[str]],
) -> None:
    """Every page read, the items are the table's rows (``value`` cells are JSON)."""
    wanted = [
        {k: json.loads(v) if k == "value" else v for k, v in row.items()}
        for row in _rows(datatable)
    ]
    last: dict[str, Any] = {}

    def served() -> bool:
        last["answer"] = read_all(instance.url, store, key, read, from_=start, to=end)
        return bool(last["answer"] == (200, wanted))

    wait_until(served, lambda: f"{read} of {key!r} answered {last['answer']}, wanted {wanted}")


@then(
    parsers.parse(
        'reading the range of "{key}" in store "{store}" {limit:d} at a time gives each entry '
        "once, in order"
    )
)
def pages_complete(instance: InstanceProcess, key: str, store: str, limit: int) -> None:
    """Pages of ``limit`` entries (the last may be shorter), following ``next``, hold every
    entry of the key once, in sort key order: what a plain fold of the topic gives."""
    expected = expected_items(instance, store)[key]
    assert len(expected) > limit, f"{key} has {len(expected)} entries: too few for pages"
    pages: list[list[Any]] = []

    def read_pages() -> bool:
        pages.clear()
        after = None
        while True:
            status, body = http(
                "GET", instance.url + read_path(store, key, "range", limit=limit, after=after)
            )
            assert status == 200, body
            pages.append(body["entries"])
            after = body["next"]
            if after is None:
                return [e for page in pages for e in page] == expected

    wait_until(read_pages, lambda: f"{len(pages)} pages: {pages}"[:4000])
    assert all(len(page) == limit for page in pages[:-1]) and 0 < len(pages[-1]) <= limit
    assert len(pages) == -(-len(expected) // limit)


@then(parsers.parse('GET "{path}" answers {status:d} saying "{reason}"'))
def get_refused(instance: InstanceProcess, path: str, status: int, reason: str) -> None:
    got, body = http("GET", instance.url + path)
    assert (got, reason in str(body.get("error") if isinstance(body, dict) else body)) == (
        status,
        True,
    ), body


# Clusters -------------------------------------------------------------------------------------


def _written(scenario_state: ScenarioState) -> list[str]:
    keys = list(dict.fromkeys(key.decode() for key, _ in scenario_state.produced))
    assert keys, "no records were produced in this scenario"
    return keys


@then(
    parsers.re(
        rf'the {READ} of every key in store "(?P<store>[\w-]+)" (?:is|are) answered from every '
        r"instance by its owner"
    )
)
def items_by_owners(
    cluster_state: ClusterState, scenario_state: ScenarioState, read: Read, store: str
) -> None:
    """From every instance (redirects followed), each key's items are the plain fold's,
    ``served_by`` its owner's active copy; an instance that does not own the key answers 307
    to the owner's same path and query."""
    members = cluster_state.live()
    where = Store.of(members[0], store)
    expected = expected_items(members[0], store)
    view = cluster_view(members[0])
    ids = member_ids(view)
    for key in _written(scenario_state):
        owner, path = owner_in(view, where, key), read_path(store, key, read, limit=1000)
        _await_items(owner + path, read, expected.get(key, []))
        for member in members:
            if member.url != owner:
                moved = http("GET", member.url + path, follow_redirects=False)
                assert moved == (307, {"location": f"{owner}{path}&hops=1"}), (member.url, moved)
            status, body = http("GET", member.url + path)
            assert status == 200 and body[ITEMS[read]] == expected.get(key, []), body
            assert body["served_by"]["role"] == "active", body
            assert body["served_by"]["instance"] == ids[owner], (member.url, key, body)
            assert body["served_by"]["partition"] == where.partition(key), body


def _await_items(url: str, read: Read, items: list[Any]) -> dict[str, Any]:
    """The body of the first 200 answer to ``url`` (not redirected) that holds ``items``."""
    last: dict[str, Any] = {}

    def answered() -> dict[str, Any] | None:
        last["answer"] = http("GET", url, follow_redirects=False, timeout=10)
        status, body = last["answer"]
        return body if status == 200 and body[ITEMS[read]] == items else None  # type: ignore[no-any-return]

    return wait_until(answered, lambda: f"{url} answered {last.get('answer')}, wanted {items}")  # type: ignore[no-any-return]


@then(
    parsers.re(
        rf'a standby of "(?P<key>[^"]+)" answers its {READ} in store "(?P<store>[\w-]+)" '
        r"with max_lag 0"
    )
)
def standby_items(cluster_state: ClusterState, key: str, read: Read, store: str) -> None:
    """The first standby the owners endpoint names answers ``?max_lag=0`` itself with the
    plain fold's items, ``served_by`` role ``standby``, lag 0, once its copy caught up (``Then
    without max_lag the standby sends the client to the owner`` may follow)."""
    members = cluster_state.live()
    where = Store.of(members[0], store)
    items = expected_items(members[0], store).get(key, [])
    assert items, f"the topic of {store} holds nothing for {key}"
    _, owners = http("GET", f"{members[0].url}/stores/{store}/owners/{key}")
    assert owners["standbys"], f"no standby of {key}'s partition: {owners}"
    standby = owners["standbys"][0]["url"]
    body = _await_items(standby + read_path(store, key, read, max_lag=0, limit=1000), read, items)
    assert body["served_by"] == {
        "instance": member_ids(cluster_view(members[0]))[standby],
        "role": "standby",
        "partition": where.partition(key),
        "lag": 0,
    }, body
    cluster_state.standby, cluster_state.owner = standby, owners["active"]
    cluster_state.standby_path = read_path(store, key, read)


@then(
    parsers.re(
        rf'it serves the {READ} of its keys in store "(?P<store>[\w-]+)", restored from the '
        "changelog"
    )
)
def restored_items(
    cluster_state: ClusterState, scenario_state: ScenarioState, read: Read, store: str
) -> None:
    """Once the restarted instance owns partitions again, it answers the items of each of its
    keys itself, as the plain fold has them, having copied changelog records into its empty
    state directory (its log says how many)."""
    restarted = cluster_state.restarted
    assert restarted is not None, "no instance was restarted in this scenario"
    wait_owner_of_some(restarted, cluster_state.live())
    where = Store.of(restarted, store)
    view = cluster_view(restarted)
    expected = expected_items(restarted, store)
    mine = [k for k in _written(scenario_state) if owner_in(view, where, k) == restarted.url]
    assert mine, f"the restarted instance owns none of the keys written: {view}"
    for key in mine:
        url = restarted.url + read_path(store, key, read, limit=1000)
        body = _await_items(url, read, expected.get(key, []))
        assert body["served_by"]["role"] == "active", body
    with open(restarted.log_path, "rb") as log:
        log.seek(cluster_state.log_offset)
        since = log.read().decode(errors="replace")
    copied = re.findall(r"after (?:restoring|copying) (\d+) changelog records", since)
    assert sum(map(int, copied)) > 0, f"nothing restored; log tail:\n{restarted.log_tail()}"


@then(
    parsers.parse(
        'the range of "{key}" in store "{store}" refuses its own cursor sent with from "{start}"'
    )
)
def cursor_outside(instance: InstanceProcess, key: str, store: str, start: str) -> None:
    """A ``next`` cursor sent back with a ``from`` after its position answers 400."""
    status, body = http("GET", instance.url + read_path(store, key, "range", limit=1))
    assert status == 200 and body["next"], body
    refused = http(
        "GET", instance.url + read_path(store, key, "range", from_=start, after=body["next"])
    )
    assert refused[0] == 400 and "outside" in refused[1]["error"], refused
