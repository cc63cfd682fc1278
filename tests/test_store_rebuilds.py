"""Rebuilds of a store's version on demand: the generations' names and order, the shared store
catalog, and rebuild requests read from the cluster topic as untrusted input (the cluster's
part on real processes: features/rebuild.feature)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer
from starlette.applications import Starlette

from foldstream.auth import RequireCredentials
from foldstream.broker import KafkaCluster
from foldstream.changelog import StoreCatalog, StoreLayout
from foldstream.cluster.map import ClusterMap
from foldstream.cluster.rebuilds import RebuildConflict, RebuildRefused, Rebuilds, rebuilt_stores
from foldstream.cluster.records import InvalidRecord, RebuildRequest, rebuild_key
from foldstream.cluster.versions import VersionSwitch
from foldstream.errors import StoreNotFound
from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product
from foldstream.kafka_topics import TopicSpec, ensure_topics
from foldstream.projections import Changes, EventProjection, Join
from foldstream.projections.versions import (
    generation_name,
    generation_of,
    logical_name,
    rank,
    rebuild_refusal,
    version_name,
    version_of,
)
from foldstream.query_api.rebuild_http import rebuild_routes
from foldstream.service import Service
from foldstream.state.format import ORDERED_FORMAT, TABLE_FORMAT
from foldstream.testing import versioned
from foldstream.testing.asgi import uvicorn_thread
from foldstream.testing.scenario import wait_until

EVENTS = "shop.events"


def test_generation_names_rank_after_their_version_and_before_the_next() -> None:
    assert generation_name("stock", 1, 0) == "stock"
    assert generation_name("stock", 1, 2) == "stock.v1.r2"
    assert generation_name("stock", 3, 1) == "stock.v3.r1"
    names = ["stock.v2", "stock.v1.r2", "stock.v2.r1", "stock", "stock.v1.r1", "stock.v1.r10"]
    assert sorted(names, key=rank) == [
        "stock",
        "stock.v1.r1",
        "stock.v1.r2",
        "stock.v1.r10",
        "stock.v2",
        "stock.v2.r1",
    ]
    assert [logical_name(n) for n in names] == ["stock"] * len(names)
    assert [version_of(n) for n in ("stock.v1.r2", "stock.v3.r1")] == [1, 3]
    assert [generation_of(n) for n in ("stock", "stock.v2", "stock.v1.r2")] == [0, 0, 2]
    assert version_name("stock.v1.r2") == "stock" and version_name("stock.v3.r1") == "stock.v3"


@pytest.mark.parametrize("name", ["stock.r1", "stock.v1.r0", "stock.v1.r01", "stock.v0.r1", "a.b"])
def test_names_that_are_no_generation_are_taken_as_they_are(name: str) -> None:
    assert generation_of(name) == 0
    assert version_name(name) == name


def test_a_generation_folds_as_its_version_under_its_own_name() -> None:
    projection = versioned.after.projection("stock.v2.r3")
    assert projection.store == "stock.v2.r3"
    assert projection.fold is versioned.after.projection("stock.v2").fold
    with pytest.raises(StoreNotFound):
        versioned.after.projection("stock.v3.r1")  # a version not declared


def test_the_catalog_is_replaced_whole_on_each_addition() -> None:
    catalog = StoreCatalog({"stock": StoreLayout(EVENTS, "shop.stock.changelog")})
    before = catalog.snapshot()
    layout = StoreLayout(EVENTS, "shop.stock.v1.r1.changelog", table_format=ORDERED_FORMAT)
    assert catalog.add("stock.v1.r1", layout)
    assert not catalog.add("stock.v1.r1", StoreLayout(EVENTS, "other"))  # never replaced
    assert list(before) == ["stock"]  # what a reader took before is unchanged
    assert list(catalog) == ["stock", "stock.v1.r1"] and catalog["stock.v1.r1"] is layout
    assert dict(catalog.formats) == {"stock": TABLE_FORMAT, "stock.v1.r1": ORDERED_FORMAT}
    assert catalog.by_changelog("shop.stock.v1.r1.changelog") == "stock.v1.r1"
    assert catalog.by_changelog("nope") is None


def test_catalog_readers_in_other_threads_see_one_consistent_version() -> None:
    catalog = StoreCatalog()
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not stop.is_set():
            snapshot = catalog.snapshot()
            seen.append(sum(1 for store in snapshot if snapshot[store].source_topic == EVENTS))

    reader = threading.Thread(target=read)
    reader.start()
    for n in range(1, 500):
        catalog.add(f"s.v1.r{n}", StoreLayout(EVENTS, f"c{n}"))
    stop.set()
    reader.join()
    assert seen == sorted(seen) and len(catalog) == 499


def test_rebuild_records_are_parsed_strictly() -> None:
    key = rebuild_key("stock")
    raw = json.dumps({"store": "stock", "version": 1, "generation": 2}).encode()
    assert RebuildRequest.from_record(key, raw) == RebuildRequest(
        store="stock", version=1, generation=2
    )
    bad = [
        b"not json",
        None,
        json.dumps({"store": "stock", "version": 1, "generation": "2"}).encode(),
        json.dumps({"store": "stock", "version": 1, "generation": 2.0}).encode(),
        json.dumps({"store": "stock", "version": 1, "generation": 0}).encode(),
        json.dumps({"store": "stock", "version": 1, "generation": 10_000}).encode(),
        json.dumps({"store": "stock", "version": 0, "generation": 1}).encode(),
        json.dumps({"store": "stock.v2", "version": 1, "generation": 1}).encode(),
        json.dumps({"store": "s" * 201, "version": 1, "generation": 1}).encode(),
        json.dumps({"store": "notes", "version": 1, "generation": 1}).encode(),  # other key
        b"{" * (1 << 21),
    ]
    for record in bad:
        with pytest.raises(InvalidRecord):
            RebuildRequest.from_record(key, record)


def test_stores_versions_refuse_cannot_be_rebuilt() -> None:
    service = Service(
        name="shop",
        aggregates={"product": Product},
        projections=[
            EventProjection("stock", fold_stock),
            EventProjection("moves", fold_stock, key=str),
            Join("totals", [Changes("stock", fold=lambda s, c: s)]),
        ],
    )
    projections = service.projections
    assert rebuild_refusal(projections, "stock") is not None
    assert "read by other stores" in (rebuild_refusal(projections, "stock") or "")
    assert "re-keyed or a join" in (rebuild_refusal(projections, "moves") or "")
    assert "re-keyed or a join" in (rebuild_refusal(projections, "totals") or "")
    assert rebuild_refusal(versioned.after.projections, "stock.v2") is None
    assert rebuild_refusal(versioned.after.projections, "nope") == "no store named 'nope'"


class _Refusals:
    """What a member asks of its service (no generation is prepared here)."""

    def refusal(self, store: str) -> str | None:
        return rebuild_refusal(versioned.after.projections, store)

    def prepare(self, store: str) -> StoreLayout:
        raise AssertionError(f"{store} prepared")


@pytest.fixture
def rebuilds(tmp_path: Path, broker: KafkaCluster) -> Iterator[Rebuilds]:
    layouts = {"stock": StoreLayout(EVENTS, "versioned.stock.changelog")}
    topic = f"rebuilds-{tmp_path.name}.cluster"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, 1, compact=True)])
    cluster_map = ClusterMap(bootstrap=broker.bootstrap, topic=topic, member_id="m1")
    cluster_map.start()
    switch = VersionSwitch(
        stores=layouts, topics={EVENTS: 2}, ready_max_lag=10, state_dir=tmp_path, hold_s=0
    )
    yield Rebuilds(
        state_dir=tmp_path,
        catalog=StoreCatalog(layouts),
        versions=switch,
        hold_added=list,
        cluster_map=cluster_map,
        generations=_Refusals(),
    )
    cluster_map.close()


def test_forged_or_malformed_requests_add_nothing_and_are_counted(
    rebuilds: Rebuilds, broker: KafkaCluster
) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    records = [
        (rebuild_key("stock"), b'{"store": "stock", "version": 1, "generation": "x"}'),
        (rebuild_key("stock"), b'{"store": "notes", "version": 1, "generation": 1}'),
        (rebuild_key("nope"), b'{"store": "nope", "version": 1, "generation": 1}'),
        (rebuild_key("stock"), b'{"store": "stock", "version": 7, "generation": 1}'),
    ]
    for key, value in records:
        producer.produce(rebuilds.map.topic, key=key, value=value)
    producer.flush(10)
    wait_until(lambda: "stock" in rebuilds.map.rebuilds(), lambda: "requests not read")
    wait_until(lambda: rebuilds.map.invalid_records == 2, lambda: "malformed ones not counted")
    assert set(rebuilds.map.rebuilds()) == {"nope", "stock"}
    rebuilds.follow()
    assert rebuilds.invalid == 2  # a store and a version not declared here
    assert list(rebuilds.catalog) == ["stock"]
    assert rebuilt_stores(rebuilds.state_dir) == frozenset()


def test_requests_naming_ever_new_stores_are_invalid_past_a_bound(
    rebuilds: Rebuilds, broker: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("foldstream.cluster.map.MAX_REBUILT_STORES", 3)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for n in range(5):
        store = f"forged{n}"
        value = json.dumps({"store": store, "version": 1, "generation": 1}).encode()
        producer.produce(rebuilds.map.topic, key=rebuild_key(store), value=value)
    producer.flush(10)
    wait_until(lambda: rebuilds.map.invalid_records == 2, lambda: "past the bound not counted")
    assert set(rebuilds.map.rebuilds()) == {"forged0", "forged1", "forged2"}


def test_a_request_names_the_next_generation_of_the_version_answering(
    rebuilds: Rebuilds,
) -> None:
    with pytest.raises(StoreNotFound):
        rebuilds.request("nope")
    asked = rebuilds.request("stock")  # version 1 answers until version 2 is live
    assert (asked.version, asked.generation) == (1, 1)
    wait_until(lambda: rebuilds.map.rebuilds().get("stock") == asked, lambda: "not published")
    assert rebuilds.wanted(asked) == "stock.v1.r1"
    with pytest.raises(RebuildConflict):  # asked for, not added yet: being built
        rebuilds.request("stock")
    stale = RebuildRequest(store="stock", version=1, generation=1)
    (rebuilds.state_dir / "retired").mkdir()
    (rebuilds.state_dir / "retired" / "stock.v1.r1").touch()
    assert rebuilds.wanted(stale) is None  # retired here: never built again
    assert rebuilds.request("stock").generation == 2  # the next after the one asked for


def test_the_route_validates_its_input(rebuilds: Rebuilds) -> None:
    app = Starlette(routes=rebuild_routes(lambda: rebuilds))
    with uvicorn_thread(app) as url, httpx.Client(base_url=url) as client:
        _ask(client, rebuilds)


def _ask(client: httpx.Client, rebuilds: Rebuilds) -> None:
    assert client.post("/stores/a.b/rebuilds").status_code == 400
    assert client.post(f"/stores/{'s' * 201}/rebuilds").status_code == 400
    assert client.post("/stores/stock/rebuilds", content=b"{}").status_code == 400
    missing = client.post("/stores/nope/rebuilds")
    assert missing.status_code == 404 and "no store named 'nope'" in missing.json()["error"]
    assert client.get("/stores/stock/rebuilds").status_code == 405
    asked = client.post("/stores/stock/rebuilds")
    assert asked.status_code == 202, asked.json()
    assert asked.json() == {"store": "stock", "version": 1, "generation": 1}
    rebuilds.versions.add("stock.v1.r1", EVENTS)  # added, not live yet: building
    building = client.post("/stores/stock/rebuilds")
    assert building.status_code == 409 and "foldstream versions" in building.json()["error"]


def test_rebuilds_need_the_credentials_commands_need() -> None:
    guard = RequireCredentials(Starlette(), check=lambda request: False)
    assert guard.protects("/stores/stock/rebuilds") and guard.protects("/commands/a/b/c")
    assert not guard.protects("/stores/stock/keys/k")


def test_a_store_versions_refuse_is_refused_naming_the_remedy(
    tmp_path: Path, rebuilds: Rebuilds
) -> None:
    class Refusing(_Refusals):
        def refusal(self, store: str) -> str | None:
            return "store 'stock' is read by other stores (Changes): declare them anew"

    rebuilds.generations = Refusing()
    with pytest.raises(RebuildRefused, match="declare them anew"):
        rebuilds.request("stock")


def test_a_generation_is_switched_to_once_live_and_replaces_its_version(tmp_path: Path) -> None:
    from foldstream.cluster.assignment import Assignment
    from foldstream.cluster.records import MemberState
    from foldstream.preflight import kept_projections, store_layouts
    from foldstream.settings import Settings

    catalog = StoreCatalog({"stock": StoreLayout(EVENTS, "shop.stock.changelog")})
    switch = VersionSwitch(
        stores=catalog, topics={EVENTS: 1}, ready_max_lag=10, state_dir=tmp_path, hold_s=0
    )
    switch.add("stock.v1.r1", EVENTS)
    catalog.add("stock.v1.r1", StoreLayout(EVENTS, "shop.stock.v1.r1.changelog"))
    assert [(v.generation, v.state) for v in switch.describe("stock")] == [
        (0, "serving"),
        (1, "building"),
    ]
    owned = Assignment(1, "a", {EVENTS: {"0": "a"}}, members=["a"])

    def member(**state: object) -> MemberState:
        lag = {"stock/0": 0, "stock.v1.r1/0": 0}
        return MemberState(id="a", url="http://127.0.0.1:1", active={EVENTS: [0]}, lag=lag, **state)  # type: ignore[arg-type]

    assert switch.update({"a": member(serving={"stock": 1})}, owned) == []
    assert switch.serving("stock") == "stock.v1.r1"
    assert switch.published() == ({"stock": 1}, {"stock": 1})
    # Retired once every member says it answers with generation 1 of version 1.
    assert switch.update({"a": member(serving={"stock": 1}, generations={"stock": 1})}, owned) == [
        "stock"
    ]
    switch.marks.retire("stock")
    (tmp_path / "rebuilds").mkdir()
    (tmp_path / "rebuilds" / "stock.v1.r1").touch()
    # A restart comes back with the generation, and without the retired version's topics.
    settings = Settings(service="versioned", state_dir=tmp_path)
    assert [p.store for p in kept_projections(versioned.before, settings)] == ["stock.v1.r1"]
    layouts = store_layouts(versioned.before, settings)
    assert layouts["stock.v1.r1"].changelog_topic == "versioned.stock.v1.r1.changelog"
    again = VersionSwitch(
        stores=layouts, topics={EVENTS: 1}, ready_max_lag=10, state_dir=tmp_path, hold_s=0
    )
    assert again.serving("stock") == "stock.v1.r1"
    assert [v.state for v in again.describe("stock")] == ["retired", "serving"]


def test_the_progress_of_a_generation_query_is_recorded_under_its_store() -> None:
    from foldstream.generations import QueryStores
    from foldstream.projections.runner import query_name

    catalog = StoreCatalog({"stock": StoreLayout(EVENTS, "c")})
    stores = QueryStores(catalog, "shop")
    catalog.add("stock.v1.r1", StoreLayout(EVENTS, "c1"))
    assert stores.get(query_name("shop", "stock.v1.r1")) == ("stock.v1.r1",)
    assert stores.get(query_name("shop", "stock+stock.v1.r1")) == ("stock", "stock.v1.r1")
    assert stores.get("other.stock") is None and stores.get("shop.nope") is None
    assert stores.get("shop.stock+nope") == ("stock",)
    assert stores.get("shop.nope+gone") is None
    assert dict(stores) == {"shop.stock": ("stock",), "shop.stock.v1.r1": ("stock.v1.r1",)}
