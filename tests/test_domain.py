from __future__ import annotations

import json
import sys
import uuid
from collections import OrderedDict
from pathlib import Path

import pytest
from eventsourcing.utils import register_topic

from foldstream.domain import DomainRuleViolation, EventCodec, EventRecord, commands_of
from foldstream.errors import UndecodableRecord
from foldstream.examples.inventory import fold_stock, service
from foldstream.examples.inventory.domain import Product
from foldstream.projections import EventProjection

SHIPPED = "foldstream.examples.inventory.domain:Product.ShipmentReceived"


def test_event_record_mapping_round_trips() -> None:
    product = Product(id="sku-1")
    product.receive_shipment(quantity=5)
    product.sell(quantity=2)
    codec = EventCodec([Product])
    records = [codec.encode(e) for e in product.collect_events()]
    assert [r.key for r in records] == [b"sku-1"] * 3
    assert [r.header("version") for r in records] == [b"1", b"2", b"3"]
    assert records[1].header("event-type") == (
        b"foldstream.examples.inventory.domain:Product.ShipmentReceived"
    )
    assert len({r.header("event-id") for r in records}) == 3
    rebuilt = None
    for record in records:
        rebuilt = codec.decode(record).mutate(rebuilt)
    assert rebuilt is not None and rebuilt.on_hand == 3 and rebuilt.version == 3


def test_rule_violation_triggers_no_event() -> None:
    product = Product(id="sku-2")
    product.receive_shipment(quantity=1)
    product.collect_events()
    with pytest.raises(DomainRuleViolation, match="only 1 on hand"):
        product.sell(quantity=2)
    assert product.collect_events() == []


def test_commands_are_the_marked_methods() -> None:
    assert sorted(commands_of(Product)) == ["receive_shipment", "sell"]


def test_fold_stock_follows_events() -> None:
    product = Product(id="sku-3")
    product.receive_shipment(quantity=4)
    product.sell(quantity=3)
    state = None
    for domain_event in product.collect_events():
        state = fold_stock(state, domain_event)
    assert state == {"on_hand": 1}


def _record(event_type: str, value: bytes = b"{}", key: bytes = b"sku-1") -> EventRecord:
    return EventRecord(key, value, (("event-type", event_type.encode()), ("version", b"1")))


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """An importable module that is not loaded, and the file it writes when imported."""
    name = f"foldstream_probe_{uuid.uuid4().hex[:8]}"
    imported = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"import pathlib\npathlib.Path({str(imported)!r}).touch()\n\ndef run():\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, imported


def test_an_event_type_resolves_only_against_the_services_aggregates_never_by_import(
    probe: tuple[str, Path],
) -> None:
    module, imported = probe
    codec = EventCodec([Product])
    for event_type in (f"{module}:run", "os:system", "foldstream.errors:UndecodableRecord"):
        with pytest.raises(UndecodableRecord, match="unknown event type"):
            codec.decode(_record(event_type))
    assert module not in sys.modules
    assert not imported.exists()
    # Not even a created event naming another class as its aggregate's, which eventsourcing
    # would import to create the aggregate.
    created = codec.encode(next(iter(Product(id="sku-1").collect_events())))
    state = json.loads(created.value or b"{}")
    state["originator_topic"] = f"{module}:run"
    forged = created._replace(value=json.dumps(state).encode())
    with pytest.raises(UndecodableRecord, match="not one of the service's aggregates"):
        codec.decode(forged)
    assert module not in sys.modules
    assert not imported.exists()
    # A codec made for no aggregate decodes nothing, even foldstream's own events.
    with pytest.raises(UndecodableRecord):
        EventCodec().decode(created)


def test_a_topic_registered_for_an_event_class_decodes_and_one_for_anything_else_does_not() -> None:
    product = Product(id="sku-4")
    product.receive_shipment(quantity=2)
    codec = EventCodec([Product])
    shipped = codec.encode(product.collect_events()[1])
    old_name = f"old.module{uuid.uuid4().hex[:6]}:Product.Received"
    register_topic(old_name, Product.ShipmentReceived)
    renamed = shipped._replace(headers=(("event-type", old_name.encode()), ("version", b"2")))
    assert codec.decode(renamed).quantity == 2
    elsewhere = f"old.module{uuid.uuid4().hex[:6]}:Thing"
    register_topic(elsewhere, OrderedDict)
    with pytest.raises(UndecodableRecord, match="unknown event type"):
        codec.decode(_record(elsewhere))


@pytest.mark.parametrize(
    ("record", "error"),
    [
        (EventRecord(b"sku-1", b"{}", ()), "is not a foldstream event"),
        (EventRecord(None, b"{}", _record(SHIPPED).headers), "is not a foldstream event"),  # type: ignore[arg-type]
        (_record(SHIPPED, b"not json"), "cannot decode event"),
        (_record(SHIPPED, b"[1, 2]"), "not an object"),
        (_record(SHIPPED, b'{"quantity": ' + b"9" * 5000 + b"}"), "Exceeds the limit"),
        (_record(SHIPPED, b"[" * 100_000 + b"]" * 100_000), "RecursionError"),
        (_record(SHIPPED, b'{"timestamp": null}'), r"lacks its fields \['quantity'\]"),
        (_record(SHIPPED, b"{}", key=b"\xff"), "UnicodeDecodeError"),
    ],
)
def test_a_record_that_is_not_an_event_of_the_service_is_undecodable(
    record: EventRecord, error: str
) -> None:
    with pytest.raises(UndecodableRecord, match=error):
        EventCodec([Product]).decode(record)


def test_a_service_gives_its_projections_its_codec() -> None:
    projection = service.projection("stock")
    assert isinstance(projection, EventProjection)
    assert projection._codec is service.codec
    assert EventProjection("stock", fold_stock)._codec is not service.codec
