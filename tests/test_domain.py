from __future__ import annotations

import pytest

from foldstream.domain import DomainRuleViolation, EventCodec, commands_of
from foldstream.examples.inventory import fold_stock
from foldstream.examples.inventory.domain import Product


def test_event_record_mapping_round_trips() -> None:
    product = Product(id="sku-1")
    product.receive_shipment(quantity=5)
    product.sell(quantity=2)
    codec = EventCodec()
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
