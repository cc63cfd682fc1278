"""A service's stores as a graph: what it accepts (hidden forwarders added for inputs of
events, re-keyed projections made joins) and what it refuses at startup, with a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from foldstream.errors import ConfigurationError
from foldstream.examples.charts import Song
from foldstream.projections import (
    Aggregation,
    Changes,
    EventProjection,
    Events,
    Join,
    OrderedProjection,
)
from foldstream.projections.graph import forwards_option, is_hidden, routes
from foldstream.projections.query_groups import query_groups, start_offsets
from foldstream.service import Service
from foldstream.state import RocksDBWriter, partition_path
from foldstream.state.host import StoreHost


def keep(state: Any, *rest: Any) -> Any:
    return state


def genre(song_id: str, song: Any) -> str:
    return "any"


def service(*projections: Any) -> Service:
    return Service("graph", aggregates={"song": Song}, projections=list(projections))


def test_a_rekeyed_projection_is_a_join_fed_by_a_hidden_forwarder() -> None:
    built = service(EventProjection("by_genre", keep, key=lambda event: "any"))
    stores = [(p.store, type(p).__name__, is_hidden(p)) for p in built.projections]
    assert stores == [("by_genre.events", "Forwarder", True), ("by_genre", "Join", False)]
    assert built.projection("by_genre").source_topic("graph.events") == (
        "graph.by_genre.repartition"
    )
    assert [r.join.store for r in routes(built.projections)["by_genre.events"]] == ["by_genre"]


def test_a_store_read_by_another_forwards_to_its_repartition_topic_only() -> None:
    built = service(
        EventProjection("plays", keep),
        Aggregation("charts", source="plays", group_by=genre, add=keep, subtract=keep),
    )
    layout = {"graph.charts.repartition": 5}
    assert forwards_option(built.projections, "plays", "graph.events", layout) == (
        '{"charts": ["graph.charts.repartition", 5]}'
    )
    assert forwards_option(built.projections, "charts", "graph.events", layout) == "{}"


@pytest.mark.parametrize(
    ("projections", "error"),
    [
        ([Join("a", [Changes("nowhere", fold=keep)])], "'nowhere', which is not a store"),
        (
            [Join("a", [Changes("b", fold=keep)]), Join("b", [Changes("a", fold=keep)])],
            "in a cycle: a -> b -> a",
        ),
        (
            [
                OrderedProjection("entries", lambda e: None),
                Join("a", [Events(keep), Changes("entries", fold=keep)]),
            ],
            "only point stores forward their changes",
        ),
    ],
)
def test_a_graph_that_cannot_run_is_refused(projections: list[Any], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        service(*projections)


def test_an_input_of_changes_needs_a_fold_or_an_adder_and_subtractor() -> None:
    with pytest.raises(ConfigurationError, match="needs fold="):
        Changes("plays", group_by=genre)
    with pytest.raises(ConfigurationError, match="not both"):
        Changes("plays", fold=keep, group_by=genre, add=keep, subtract=keep)


def test_reserved_keys_are_refused_by_lookups_batches_and_commands() -> None:
    """Stores keep their marks and cursors under keys starting with a NUL byte: no request may
    name one (a lookup, a batch, an aggregate id)."""
    from foldstream.errors import InvalidRequest
    from foldstream.http_input import InputLimits
    from foldstream.query_api.batch import BadBatch, _is_plain, _keys

    limits = InputLimits()
    for raw in (b"%00cursor%00top5", b"%00"):
        with pytest.raises(InvalidRequest, match="NUL byte is reserved"):
            limits.key(raw)
    with pytest.raises(InvalidRequest, match="aggregate id starting with a NUL"):
        limits.key(b"%00mark", "aggregate id")
    with pytest.raises(BadBatch, match="NUL byte is reserved"):
        _keys(b'["ok", "\\u0000mark"]', limits, _is_plain(b'["ok", "\\u0000mark"]'))
    assert limits.key(b"a%00b") == b"a\x00b"  # only the first byte is reserved


def test_the_stores_of_a_topic_that_fold_on_their_own_share_a_query() -> None:
    built = service(
        EventProjection("plays", keep),
        EventProjection("titles", keep),
        OrderedProjection("history", entry=lambda event: None),
        Aggregation("charts", source="plays", group_by=genre, add=keep, subtract=keep),
        EventProjection("by_genre", keep, key=lambda event: "any"),
        EventProjection("titles", keep, version=2),
    )
    groups = [(g.topic, g.stores) for g in query_groups(built.projections, "graph.events")]
    assert groups == [
        # plays forwards its changes to charts: its exactly-once bookkeeping is its own
        ("graph.events", ("plays",)),
        ("graph.events", ("titles",)),  # version 2 builds beside it: each alone meanwhile
        ("graph.events", ("history",)),
        ("graph.charts.repartition", ("charts",)),
        ("graph.events", ("by_genre.events",)),  # a hidden forwarder
        ("graph.by_genre.repartition", ("by_genre",)),
        ("graph.events", ("titles.v2",)),  # a new version builds beside the one answering
    ]
    # A rebuild generation builds beside the version it rebuilds, then takes its place.
    generation = service(EventProjection("titles", keep)).projection("titles.v1.r1")
    groups = [g.stores for g in query_groups([*built.projections[:2], generation], "graph.events")]
    assert groups == [("plays",), ("titles",), ("titles.v1.r1",)]
    groups = [g.stores for g in query_groups([built.projections[0], generation], "graph.events")]
    assert groups == [("plays", "titles.v1.r1")]  # plays forwards to no store here


def test_a_shared_query_reads_a_partition_from_the_lowest_offset_of_the_stores_folding_it(
    tmp_path: Path,
) -> None:
    for store, offset in (("stock", 9), ("sales", 4)):
        writer = RocksDBWriter(partition_path(tmp_path, store, 0), identity="t/0")
        writer.commit(offset)
        writer.close()
    host = StoreHost(state_dir=tmp_path)
    host.start()
    try:
        for store in ("stock", "sales"):
            host.open(store, 0, identity="t/0", epoch=1)
        host.open("stock", 1, identity="t/1", epoch=1)  # sales does not hold 1 (yet)
        both: dict[str, set[int]] = {"stock": set(), "sales": set()}
        assert start_offsets(host, "t", both, [0, 1, 2]) == {0: 5, 1: 0}
        # A partition one store stopped at a poison record is read for the others only.
        assert start_offsets(host, "t", {"stock": set(), "sales": {0}}, [0]) == {0: 10}
        assert start_offsets(host, "t", {"stock": {0}, "sales": {0}}, [0]) == {}
    finally:
        host.stop()
