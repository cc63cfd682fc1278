"""Versions of a store: declared beside each other, switched to once caught up, retired once
every member has switched (the cluster's part on real processes: features/versions.feature)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from foldstream.changelog import StoreLayout
from foldstream.cluster.records import MemberState
from foldstream.cluster.versions import VersionSwitch, retired_stores
from foldstream.errors import ConfigurationError
from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product
from foldstream.projections import Changes, EventProjection, Join, OrderedProjection
from foldstream.projections.versions import logical_name, version_of, versioned_name
from foldstream.service import Service

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


def _switch(tmp_path: Path) -> VersionSwitch:
    return VersionSwitch(
        stores=STORES, topics={EVENTS: 2, "notes": 1}, ready_max_lag=10, state_dir=tmp_path
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
    service = Service(
        name="shop",
        aggregates={"product": Product},
        projections=[
            EventProjection("stock", fold_stock),
            EventProjection("stock", fold_stock, version=2),
        ],
    )
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
            "of different kinds",
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
    assert switch.update({"a": building}) == []
    assert switch.serving("stock") == "stock"
    assert [v.state for v in switch.describe("stock")] == ["serving", "building"]
    # Caught up but further behind than the version answering now: still not.
    behind = _member("a", {"stock/0": 0, "stock/1": 0, "stock.v2/0": 0, "stock.v2/1": 3})
    switch.update({"a": behind})
    assert switch.serving("stock") == "stock"
    caught_up = _member("a", {"stock/0": 2, "stock/1": 1, "stock.v2/0": 2, "stock.v2/1": 0})
    switch.update({"a": caught_up})
    assert switch.serving("stock") == "stock.v2"
    assert switch.counts("stock.v2") and not switch.counts("stock")
    assert switch.published() == {"stock": 2}
    # Never back, even when the new version falls behind again.
    switch.update({"a": building})
    assert switch.serving("stock") == "stock.v2"


def test_the_old_version_retires_once_every_member_answers_with_the_new(tmp_path: Path) -> None:
    switch = _switch(tmp_path)
    lag = {"stock/0": 0, "stock/1": 0, "stock.v2/0": 0, "stock.v2/1": 0}
    members = {"a": _member("a", lag), "b": _member("b", lag, serving={"stock": 1})}
    assert switch.update(members) == []  # b still answers with version 1
    assert switch.serving("stock") == "stock.v2"
    members["a"] = _member("a", lag, serving={"stock": 2})
    members["b"] = _member("b", lag, serving={"stock": 2})
    assert switch.update(members, {EVENTS: {0: 7, 1: 5}}) == ["stock"]
    assert [(v.state, v.folded, v.total) for v in switch.describe("stock")] == [
        ("replaced", 12, 12),
        ("serving", 12, 12),
    ]
    (tmp_path / "stores" / "stock" / "p0000").mkdir(parents=True)
    (tmp_path / "stores" / "stock" / "p0001").mkdir(parents=True)
    switch.retire("stock")
    assert switch.is_retired("stock") and retired_stores(tmp_path) == {"stock"}
    switch.delete_directories(frozenset({("stock", 1)}))  # a copy still open: kept
    assert (tmp_path / "stores" / "stock").exists()
    switch.delete_directories(frozenset({("stock.v2", 1)}))
    assert not (tmp_path / "stores" / "stock").exists()
    assert switch.update(members) == []
    # A restart keeps it retired, and answers with the newest version from the start.
    again = _switch(tmp_path)
    assert again.is_retired("stock") and again.serving("stock") == "stock.v2"
    assert [v.state for v in again.describe("stock")] == ["retired", "serving"]
