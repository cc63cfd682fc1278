"""A command's arguments are validated by pydantic from its signature, strictly, as JSON, and
the same adapter gives the JSON schema that /openapi.json publishes."""

from __future__ import annotations

import asyncio
import datetime
import enum
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate
from starlette.applications import Starlette

from foldstream.api_docs import api_docs_routes
from foldstream.commands import InvalidArguments, command_arguments
from foldstream.domain import Aggregate, command
from foldstream.errors import ConfigurationError
from foldstream.examples.inventory import service as inventory
from foldstream.http_input import InputLimits
from foldstream.openapi import StoreReads, openapi_document


class Colour(enum.Enum):
    red = "red"
    blue = "blue"


@dataclass
class Line:
    sku: str
    quantity: int


class Order(Aggregate):
    def __init__(self, id: str) -> None:
        self.lines: list[Line] = []

    @command
    def add(self, sku: str, quantity: int, price: float = 1.0, gift: bool = False) -> None:
        """Add a line to the order.

        More about adding lines."""

    @command
    def place(self, lines: list[Line], due: datetime.date, colour: Colour, note: Any) -> None:
        pass

    @command
    def tag(self, label: str, **extra: Any) -> None:
        pass


class Opaque:
    pass


ORDER = command_arguments({"order": Order})["order"]


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"sku": "a", "quantity": "5"}, "argument 'quantity' must be int, got str"),
        ({"sku": "a", "quantity": 5.0}, "argument 'quantity' must be int, got float"),
        ({"sku": "a", "quantity": True}, "argument 'quantity' must be int, got bool"),
        ({"sku": "a", "quantity": None}, "argument 'quantity' must be int, got NoneType"),
        ({"sku": 1, "quantity": 1}, "argument 'sku' must be str, got int"),
        ({"sku": "a", "quantity": 1, "gift": 1}, "argument 'gift' must be bool, got int"),
        ({"sku": "a"}, "missing argument 'quantity'"),
        ({"sku": "a", "quantity": 1, "qty": 1}, "unexpected argument 'qty'"),
        ([1], "JSON object"),
        ("text", "JSON object"),
    ],
)
def test_refuses_arguments_that_do_not_match_naming_the_argument(
    arguments: Any, reason: str
) -> None:
    with pytest.raises(InvalidArguments, match=reason):
        ORDER["add"].bind(arguments)


def test_every_wrong_argument_is_named_with_the_signature() -> None:
    with pytest.raises(InvalidArguments) as refused:
        ORDER["add"].bind({"qty": 1})
    assert str(refused.value) == (
        "missing argument 'sku'; missing argument 'quantity'; unexpected argument 'qty' (the "
        "command takes (sku: str, quantity: int, price: float = 1.0, gift: bool = False))"
    )


def test_accepts_json_forms_and_converts_to_the_declared_types() -> None:
    assert ORDER["add"].bind({"sku": "a", "quantity": 2, "price": 3}) == {
        "sku": "a",
        "quantity": 2,
        "price": 3.0,
    }
    bound = ORDER["place"].bind(
        {
            "lines": [{"sku": "a", "quantity": 1}],
            "due": "2026-01-31",
            "colour": "blue",
            "note": {"any": ["json"]},
        }
    )
    assert bound == {
        "lines": [Line("a", 1)],
        "due": datetime.date(2026, 1, 31),
        "colour": Colour.blue,
        "note": {"any": ["json"]},
    }


def test_nested_errors_say_where() -> None:
    with pytest.raises(InvalidArguments, match=r"argument 'lines'\[0\]\['quantity'\]"):
        ORDER["place"].bind(
            {"lines": [{"sku": "a", "quantity": "1"}], "due": "2026-01-31", "colour": "red"}
        )
    with pytest.raises(InvalidArguments, match="argument 'colour'"):
        ORDER["place"].bind({"lines": [], "due": "2026-01-31", "colour": "green", "note": 1})


def test_keyword_arguments_let_any_other_argument_through() -> None:
    assert ORDER["tag"].bind({"label": "x", "colour": 1}) == {"label": "x", "colour": 1}


def test_commands_whose_arguments_cannot_come_from_json_are_refused_at_start() -> None:
    class Positional(Aggregate):
        @command
        def move(self, steps: int, /) -> None:
            pass

    class Things(Aggregate):
        @command
        def move(self, thing: Opaque) -> None:  # a class pydantic knows nothing of
            pass

    with pytest.raises(ConfigurationError, match="positional-only"):
        command_arguments({"positional": Positional})
    with pytest.raises(ConfigurationError, match="cannot come from JSON"):
        command_arguments({"things": Things})


def test_the_json_schema_is_the_validators() -> None:
    schema = ORDER["add"].json_schema()
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["sku", "quantity"]
    assert schema["properties"]["quantity"]["type"] == "integer"
    assert schema["properties"]["price"] == {"default": 1.0, "title": "Price", "type": "number"}


def document(**secured: bool) -> dict[str, Any]:
    return openapi_document(
        title="orders",
        version="1",
        commands={**command_arguments(inventory.aggregates), "order": ORDER},
        stores={
            "stock": StoreReads(),
            "orders": StoreReads(),
            "bookings": StoreReads("ordered", "time"),
            "sales": StoreReads("windowed", "time"),
            "ranks": StoreReads("ordered", "int"),
        },
        limits=InputLimits(),
        commands_secured=secured.get("commands", False),
        queries_secured=secured.get("queries", False),
    )


def test_openapi_document_is_valid_and_describes_each_command_and_store() -> None:
    spec = document()
    validate(spec)  # raises on an invalid OpenAPI 3.1 document
    paths = spec["paths"]
    sell = paths["/commands/product/{id}/sell"]["post"]
    assert sell["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/product.sell.arguments"
    }
    add = paths["/commands/order/{id}/add"]["post"]
    assert add["summary"] == "Add a line to the order."
    assert add["description"] == "More about adding lines."
    schemas = spec["components"]["schemas"]
    assert schemas["order.place.arguments"]["properties"]["lines"]["items"] == {
        "$ref": "#/components/schemas/Line"
    }
    assert set(schemas["Line"]["properties"]) == {"sku", "quantity"}
    for store in ("stock", "orders"):
        assert f"/stores/{store}/keys/{{key}}" in paths
        assert f"/stores/{store}/keys" in paths
        assert f"/stores/{store}/owners/{{key}}" in paths
    lookup = paths["/stores/stock/keys/{key}"]["get"]
    assert set(lookup["responses"]) == {"200", "307", "400", "404", "414", "503"}
    assert "security" not in sell and "securitySchemes" not in spec["components"]


def test_openapi_document_gives_ordered_and_windowed_stores_their_reads() -> None:
    """An ordered store is read by ranges and a windowed one by windows: those are their
    paths (a lookup of either answers 400), with the answers' schemas."""
    spec = document()
    paths, schemas = spec["paths"], spec["components"]["schemas"]
    ranges = paths["/stores/bookings/keys/{key}/range"]["get"]
    assert [p["name"] for p in ranges["parameters"]] == [
        "key", "from", "to", "limit", "after", "max_lag", "consistent_with", "hops"
    ]  # fmt: skip
    assert ranges["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RangeAnswer"
    }
    windows = paths["/stores/sales/keys/{key}/windows"]["get"]
    assert windows["responses"]["307"]["headers"]["Location"]
    assert set(schemas["WindowsAnswer"]["required"]) == {"key", "windows", "next", "served_by"}
    assert set(schemas["RangeEntry"]["properties"]) == {"sort_key", "value"}
    for store in ("bookings", "sales"):
        assert f"/stores/{store}/keys/{{key}}" not in paths
        assert f"/stores/{store}/owners/{{key}}" in paths
    assert "/stores/stock/keys/{key}/range" not in paths
    # A key without entries answers 200 with none: the only 404 is an unknown store.
    assert ranges["responses"]["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorAnswer"
    }
    limit = next(p for p in windows["parameters"] if p["name"] == "limit")
    assert (limit["schema"]["default"], limit["schema"]["maximum"]) == (1000, 1000)
    bound = next(p for p in ranges["parameters"] if p["name"] == "from")
    assert "%2B" in bound["description"]
    ranks = paths["/stores/ranks/keys/{key}/range"]["get"]["parameters"]
    assert next(p for p in ranks if p["name"] == "to")["schema"] == {"type": "integer"}


def test_openapi_document_says_which_paths_need_a_token() -> None:
    spec = document(commands=True)
    validate(spec)
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert spec["paths"]["/commands/product/{id}/sell"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/stores/stock/keys/{key}"]["get"]
    rebuild = spec["paths"]["/stores/{store}/rebuilds"]["post"]  # secured as commands are
    assert rebuild["security"] == [{"bearer": []}]
    answer = rebuild["responses"]["202"]["content"]["application/json"]["schema"]
    assert answer["$ref"].endswith("/RebuildAnswer")
    assert "generation" in spec["components"]["schemas"]["StoreVersion"]["properties"]
    spec = document(commands=True, queries=True)
    assert spec["paths"]["/stores/stock/keys/{key}"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/ready"]["get"]


def test_openapi_json_and_the_docs_page_come_from_the_package() -> None:
    asyncio.run(_openapi_json_and_the_docs_page())


async def _openapi_json_and_the_docs_page() -> None:
    app = Starlette(routes=api_docs_routes(document()))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://instance") as client:
        answer = await client.get("/openapi.json")
        assert answer.status_code == 200 and answer.json() == document()
        page = await client.get("/docs/")
        assert page.status_code == 200 and "vendor/swagger-ui/swagger-ui-bundle.js" in page.text
        assert "//" not in page.text  # nothing from elsewhere
        bundle = await client.get("/docs/vendor/swagger-ui/swagger-ui-bundle.js")
        assert bundle.status_code == 200 and len(bundle.content) > 100_000
        assert (await client.get("/docs/vendor/swagger-ui/LICENSE")).status_code == 200
