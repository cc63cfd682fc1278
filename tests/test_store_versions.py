"""Versions of a store: declared beside each other, switched to once caught up, retired once
every member has switched (the cluster's part on real processes: features/versions.feature)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from foldstream.changelog import StoreLayout
from foldstream.cluster.assignment import Assignment
from foldstream.cluster.records import MemberState
from foldstream.cluster.version_cleanup import retired_stores
from foldstream.cluster.versions import VersionSwitch
from foldstream.errors import ConfigurationError
from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product
from foldstream.projections import Changes, EventProjection, Join, OrderedProjection
from foldstream.projections.versions import logical_name, version_of, versioned_name
from foldstream.service import Service
from foldstream.testing import versioned

EVENTS = "shop.events"
STORES = {
    "stock": StoreLayout(EVENTS, "shop.stock.changelog"),
    "stock.v2": StoreLayout(EVENTS, "shop.stock.v2.changelog"),
    "notes": StoreLayout("notes", "shop.notes.changelog"),
}


def _member(name: str, lag: dict[str, int], **state: Any) -> MemberState:
    return MemberState(
        id=name, url="http://127.0.0.1:1", active={EVENTS: [0, 1], "notes": [0]}, lag=lag, **state
    )


#: Member "a" owns every partition (a member it does not name owns nothing, whatever it says).
OWNED_BY_A = Assignment(1, "a", {EVENTS: {"0": "a", "1": "a"}, "notes": {"0": "a"}}, members=["a"])


def _switch(tmp_path: Path, hold_s: float = 0.0) -> VersionSwitch:
    return VersionSwitch(
        stores=STORES,
        topics={EVENTS: 2, "notes": 1},
        ready_max_lag=10,
        state_dir=tmp_path,
        hold_s=hold_s,
    )


def test_names_of_versions() -> None:
    assert versioned_name("stock", 1) == "stock"
    assert versioned_name("stock", 12) == "stock.v12"
    assert [logical_name(s) for s in ("stock.v12", "stock", "x.events", "a.v0")] == [
        "stock",
        "stock",
        "x.events",
        "a.v0",
    ]
    assert version_of("stock.v12") == 12 and version_of("stock") == 1


def test_a_service_folds_each_declared_version_under_its_own_name() -> None:
    service = versioned.after  # version 1 of stock, and version 2 beside it
    assert [p.store for p in service.projections] == ["stock", "stock.v2"]


@pytest.mark.parametrize(
    ("declare", "says"),
    [
        (lambda: [EventProjection("stock", fold_stock, version=0)], "version must be 1 to"),
        (lambda: [EventProjection("stock", fold_stock, version=True)], "version must be an int"),
        (
            lambda: [EventProjection("stock", fold_stock), EventProjection("stock", fold_stock)],
            "declares version 1 twice",
        ),
        (
            lambda: [
                EventProjection("stock", fold_stock, version=2),
                OrderedProjection("stock", entry=lambda e: None, version=3),
            ],
            "differ in kind or partitioner",
        ),
        (
            lambda: [
                EventProjection("stock", fold_stock, version=2),
                Join("totals", [Changes("stock", fold=lambda s, c: s)]),
            ],
            "other stores read its changes",
        ),
        (lambda: [EventProjection("stock", fold_stock, key=str, version=2)], "re-keyed store"),
    ],
)
def test_versions_that_cannot_be_declared(declare: Callable[[], list[Any]], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        Service(name="shop", aggregates={"product": Product}, projections=declare())


def test_the_oldest_version_answers_until_a_newer_one_is_live(tmp_path: Path) -> None:
    switch = _switch(tmp_path)
    assert switch.serving("stock") == "stock" and switch.serving("notes") == "notes"
    assert switch.counts("stock") and not switch.counts("stock.v2") and switch.counts("notes")
    # v2 caught up on partition 0 only: not live.
    building = _member("a", {"stock/0": 0, "stock/1": 0, "stock.v2/0": 0, "stock.v2/1": 500})
    assert switch.update({"a": building}, OWNED_BY_A) == []
    assert switch.serving("stock") == "stock"
    assert [v.state for v in switch.describe("stock")] == ["serving", "building"]
    # Caught up but further behind than the version answering now: still not.
    behind = _member("a", {"stock/0": 0, "stock/1": 0, "stock.v2/0": 0, "stock.v2/1": 3})
    switch.update({"a": behind}, OWNED_BY_A)
    assert switch.serving("stock") == "stock"
    caught_up = _member("a", {"stock/0": 2, "stock/1": 1, "stock.v2/0": 2, "stock.v2/1": 0})
    switch.update({"a": caught_up}, OWNED_BY_A)
    assert switch.serving("stock") == "stock.v2"
    assert switch.counts("stock.v2") and not switch.counts("stock")
    assert switch.published() == ({"stock": 2}, {})
    # Never back, even when the new version falls behind again.
    switch.update({"a": building}, OWNED_BY_A)
    assert switch.serving("stock") == "stock.v2"


def test_the_old_version_retires_once_every_member_answers_with_the_new(tmp_path: Path) -> None:
    switch = _switch(tmp_path)
    lag = {"stock/0": 0, "stock/1": 0, "stock.v2/0": 0, "stock.v2/1": 0}
    members = {"a": _member("a", lag), "b": _member("b", lag, serving={"stock": 1})}
    assert switch.update(members, OWNED_BY_A) == []  # b still answers with version 1
    assert switch.serving("stock") == "stock.v2"
    members["a"] = _member("a", lag, serving={"stock": 2})
    members["b"] = _member("b", lag, serving={"stock": 2})
    assert switch.update(members, OWNED_BY_A, {EVENTS: {0: 7, 1: 5}}) == ["stock"]
    assert [(v.state, v.folded, v.total) for v in switch.describe("stock")] == [
        ("replaced", 12, 12),
        ("serving", 12, 12),
    ]
    (tmp_path / "stores" / "stock" / "p0000").mkdir(parents=True)
    (tmp_path / "stores" / "stock" / "p0001").mkdir(parents=True)
    switch.marks.retire("stock")
    assert switch.is_retired("stock") and retired_stores(tmp_path) == {"stock"}
    switch.marks.delete_directories(frozenset({("stock", 1)}))  # a copy still open: kept
    assert (tmp_path / "stores" / "stock").exists()
    switch.marks.delete_directories(frozenset({("stock.v2", 1)}))
    assert not (tmp_path / "stores" / "stock").exists()
    assert switch.update(members, OWNED_BY_A) == []
    # A restart keeps it retired, and answers with the newest version from the start.
    again = _switch(tmp_path)
    assert again.is_retired("stock") and again.serving("stock") == "stock.v2"
    assert [v.state for v in again.describe("stock")] == ["retired", "serving"]


def test_a_restarted_member_answers_with_the_version_it_switched_to(tmp_path: Path) -> None:
    switch = _switch(tmp_path)
    lag = {"stock/0": 0, "stock/1": 0, "stock.v2/0": 0, "stock.v2/1": 0}
    switch.update({"a": _member("a", lag)}, OWNED_BY_A)
    assert switch.serving("stock") == "stock.v2"
    # Not retired yet (another member still answers with version 1), and restarted:
    assert _switch(tmp_path).serving("stock") == "stock.v2"


def test_records_that_are_not_the_named_owners_or_do_not_last_switch_nothing(
    tmp_path: Path,
) -> None:
    caught_up = {"stock/0": 0, "stock/1": 0, "stock.v2/0": 0, "stock.v2/1": 0}
    # A record of a member the assignment does not name, claiming every partition.
    switch = _switch(tmp_path / "forged")
    assert switch.update({"a": _member("a", {}), "x": _member("x", caught_up)}, OWNED_BY_A) == []
    assert switch.serving("stock") == "stock"
    # The named owner's own record, but the switch waits until it has held for hold_s.
    waiting = _switch(tmp_path / "waiting", hold_s=3600)
    waiting.update({"a": _member("a", caught_up)}, OWNED_BY_A)
    assert waiting.serving("stock") == "stock"
    everyone = {"a": _member("a", caught_up, serving={"stock": 2})}
    switched = _switch(tmp_path / "switched")
    switched.update(everyone, OWNED_BY_A)
    assert switched.serving("stock") == "stock.v2"
    switched.hold_s = 3600  # retiring waits for hold_s too
    assert switched.update(everyone, OWNED_BY_A) == []


def test_a_member_answering_only_with_version_2_publishes_it(tmp_path: Path) -> None:
    only = VersionSwitch(
        stores={"stock.v2": STORES["stock.v2"]},
        topics={EVENTS: 2},
        ready_max_lag=10,
        state_dir=tmp_path,
        hold_s=0,
    )
    assert only.published() == ({"stock": 2}, {})


def test_code_rolled_back_past_a_switch_is_refused_with_the_remedy(tmp_path: Path) -> None:
    from foldstream.preflight import kept_projections
    from foldstream.settings import Settings

    settings = Settings(service="versioned", state_dir=tmp_path)
    both, only_v1 = versioned.after, versioned.before
    _switch(tmp_path).marks.retire("stock")
    assert [p.store for p in kept_projections(both, settings)] == ["stock.v2"]
    with pytest.raises(ConfigurationError, match="Declare that newer version again"):
        kept_projections(only_v1, settings)
