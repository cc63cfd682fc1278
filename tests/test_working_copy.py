"""Commands run on a working copy: a command that fails after its events changed the copy leaves
the aggregate in memory as it was (unit tests of the copy, and one through a real handler)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from foldstream.broker import KafkaCluster
from foldstream.commands import CommandHandler
from foldstream.commands.working_copy import working_copy
from foldstream.domain import Aggregate, DomainRuleViolation, command, event
from foldstream.examples.inventory.domain import Product
from tests.test_command_ownership import PARTITIONS, new_topic


class Basket(Aggregate):
    """Holds mutable state, and a command that breaks a rule after one of its events applied."""

    def __init__(self, id: str) -> None:  # noqa: A002
        self.items: list[str] = []
        self.counts: dict[str, int] = {}
        self.same_items = self.items

    @command
    def add(self, item: str) -> None:
        self._added(item)

    @command
    def add_unless_full(self, item: str) -> None:
        self._added(item)
        if len(self.items) > 2:
            raise DomainRuleViolation("a basket holds two items")

    @event("Added")
    def _added(self, item: str) -> None:
        self.items.append(item)
        self.counts[item] = self.counts.get(item, 0) + 1


def _committed(aggregate: Any) -> Any:
    list(aggregate.collect_events())
    return aggregate


def test_a_copy_shares_nothing_mutable_with_the_original() -> None:
    basket = Basket(id="b-1")
    basket.add("apple")
    _committed(basket)
    copied = working_copy(basket)
    copied.add("pear")
    assert basket.items == ["apple"] and basket.counts == {"apple": 1}
    assert copied.items == ["apple", "pear"] and copied.counts == {"apple": 1, "pear": 1}
    assert copied.same_items is copied.items  # values shared by two attributes stay shared
    assert copied.version == basket.version + 1
    assert not list(basket.collect_events())  # the copy's events are its own
    assert [type(e).__name__ for e in copied.collect_events()] == ["Added"]


def test_an_aggregate_of_immutable_values_is_copied_cheaply_and_correctly() -> None:
    product = _committed(Product(id="sku-1"))
    product.receive_shipment(3)
    _committed(product)
    copied = working_copy(product)
    copied.receive_shipment(2)
    assert (product.on_hand, copied.on_hand) == (3, 5)
    assert product._pending_events == [] and len(copied._pending_events) == 1


class Slotted:
    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items = [1]


class WithState:
    def __init__(self) -> None:
        self.items = [1]

    def __getstate__(self) -> dict[str, Any]:
        return {"items": list(self.items)}


class WithNewArgs:
    """Made by ``__new__`` with an argument that its ``__getnewargs__`` gives back."""

    def __new__(cls, size: int) -> WithNewArgs:
        made = super().__new__(cls)
        made.size = size
        return made

    def __init__(self, size: int) -> None:
        self.items = [1]

    def __getnewargs__(self) -> tuple[int]:
        return (self.size,)


@pytest.mark.parametrize("cls", [Slotted, WithState, WithNewArgs])
def test_objects_with_their_own_state_hooks_are_deep_copied(cls: type) -> None:
    original = cls(3) if cls is WithNewArgs else cls()
    copied = working_copy(original)
    copied.items.append(2)
    assert original.items == [1] and copied.items == [1, 2]
    assert type(copy.deepcopy(original)) is type(copied)


def test_a_command_failing_after_its_event_leaves_no_trace(broker: KafkaCluster) -> None:
    handler = CommandHandler(
        aggregates={"basket": Basket},
        bootstrap=broker.bootstrap,
        topic=new_topic(broker),
        partitions=PARTITIONS,
    )

    async def scenario() -> None:
        handler.start()
        await asyncio.to_thread(handler.assign, range(PARTITIONS))
        for item in ("apple", "pear"):
            await handler.handle("basket", "b-1", "add", {"item": item})
        with pytest.raises(DomainRuleViolation):
            await handler.handle("basket", "b-1", "add_unless_full", {"item": "plum"})
        basket = handler._writer(handler.partition_of("b-1")).aggregates.get("b-1")
        assert basket is not None
        assert basket.items == ["apple", "pear"] and "plum" not in basket.counts
        assert handler.version("b-1") == 3  # created, apple, pear
        result = await handler.handle("basket", "b-1", "add", {"item": "fig"})
        assert result.events[-1]["version"] == 4

    try:
        asyncio.run(scenario())
    finally:
        handler.close()
