"""Every route of an instance refuses a query parameter it does not take: 400 naming it and
the parameters the route takes, never ignored; the OpenAPI document and the client agree with
the routes' declarations (foldstream.route_params)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route

from foldstream.client.flows import read_params
from foldstream.commands import command_arguments
from foldstream.examples.inventory import service as inventory
from foldstream.http_input import InputLimits
from foldstream.instance import Instance
from foldstream.openapi import StoreReads, openapi_document
from foldstream.route_params import (
    BATCH,
    CLUSTER,
    COMMAND,
    HEALTH,
    LOOKUP,
    METRICS,
    OWNERS,
    RANGE_READ,
    READY,
    REBUILD,
    STORES,
    WINDOWS_READ,
    RouteParams,
)
from foldstream.settings import Settings

#: A value for each path parameter of the routes.
_PATH_VALUES = {
    "store": "stock",
    "key": "sku-1",
    "aggregate": "product",
    "aggregate_id": "sku-1",
    "command": "sell",
}


def _instance(tmp_path: Path) -> Instance:
    """The inventory example's instance, not started: the routes refuse a parameter before
    they need anything started."""
    return Instance(
        service=inventory,
        service_path="foldstream.examples.inventory:service",
        settings=Settings(service="inventory", state_dir=tmp_path),
    )


def _request_of(route: BaseRoute) -> tuple[str, str]:
    """A method and a path the route takes (a page's root for a mount of files)."""
    if isinstance(route, Mount):
        return "GET", route.path + "/"
    assert isinstance(route, Route), route
    path = re.sub(
        r"\{(\w+)(?::\w+)?\}", lambda m: _PATH_VALUES[m.group(1)], route.path
    )  # {key:path} too
    return sorted((route.methods or {"GET"}) - {"HEAD"})[0], path


def _answers(app: Any, requests: list[tuple[str, str]]) -> list[httpx.Response]:
    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://i") as client:
            return [
                await client.request(method, target, content=b"{}") for method, target in requests
            ]

    return asyncio.run(send())


def test_every_route_refuses_a_parameter_it_does_not_take(tmp_path: Path) -> None:
    """Walks every route of the app (a route added without a declaration fails here), through
    the app's whole front: the lookup fast path, the direct routes, Starlette's router."""
    instance = _instance(tmp_path)
    requests = [_request_of(route) for route in instance.routes]
    assert len(requests) >= 14, requests  # commands, reads, instance routes, pages
    # Ranges and windows are read through the lookup's route ({key:path}).
    requests += [("GET", "/stores/sales_10m/keys/sku-1/windows"), ("GET", "/stores/x/keys/k/range")]
    sent = [(method, f"{path}?bogus=1") for method, path in requests]
    for (method, target), answer in zip(sent, _answers(instance.app, sent), strict=True):
        assert answer.status_code == 400, (method, target, answer.text)
        error = answer.json()["error"]
        assert error.startswith("unknown query parameter(s) of "), (target, error)
        assert "'bogus'" in error and "this route takes" in error, (target, error)


def test_the_parameters_a_route_takes_are_not_refused(tmp_path: Path) -> None:
    """Declared parameters pass the check (what they say is checked after it: the instance is
    not started, so the answer is whatever comes next, never the unknown-parameter 400)."""
    instance = _instance(tmp_path)
    requests = [
        ("POST", "/commands/product/sku-1/sell?expected_version=1&hops=1"),
        ("GET", "/stores/stock/keys/sku-1?max_lag=1&hops=1"),
        ("GET", "/stores/sales_10m/keys/sku-1/windows?from=0&to=1&limit=5&max_lag=1&hops=1"),
    ]
    for (_, target), answer in zip(requests, _answers(instance.app, requests), strict=True):
        assert "unknown query parameter" not in answer.text, (target, answer.text)


def test_the_refusal_names_each_unknown_parameter_once_and_is_bounded() -> None:
    names = ["expected_versoin", *(f"p{n}" for n in range(20)), "expected_versoin", "x" * 5000]
    with pytest.raises(Exception, match="unknown") as refused:
        COMMAND.check([(name, "1") for name in names])
    message = str(refused.value)
    assert message.count("expected_versoin") == 1, message
    assert "(did you mean 'expected_version'?)" in message
    assert "and 17 more" in message and len(message) < 600, message
    assert message.endswith(
        "this route takes expected_version, hops "
        "(a parameter it does not take is refused, never ignored)"
    ), message


def _declared(path: str) -> RouteParams:
    """The declaration of a path of the OpenAPI document."""
    by_shape = [
        (r"/commands/", COMMAND),
        (r"/keys/\{key\}/range$", RANGE_READ),
        (r"/keys/\{key\}/windows$", WINDOWS_READ),
        (r"/keys/\{key\}$", LOOKUP),
        (r"/keys$", BATCH),
        (r"/owners/", OWNERS),
        (r"/rebuilds$", REBUILD),
        (r"^/stores$", STORES),
        (r"^/cluster$", CLUSTER),
        (r"^/health$", HEALTH),
        (r"^/ready$", READY),
        (r"^/metrics$", METRICS),
    ]
    return next(params for shape, params in by_shape if re.search(shape, path))


def test_the_openapi_document_publishes_the_declarations() -> None:
    spec = openapi_document(
        title="inventory",
        version="1",
        commands=command_arguments(inventory.aggregates),
        stores={"stock": StoreReads(), "sales": StoreReads("windowed", "time")},
        limits=InputLimits(),
        commands_secured=False,
        queries_secured=False,
    )
    for path, methods in spec["paths"].items():
        for operation in methods.values():
            query = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            assert query == [p.name for p in _declared(path).takes], path
            assert "400" in operation["responses"], path


def test_the_client_sends_only_parameters_the_routes_take() -> None:
    every = read_params(start=1, end=2, limit=3, after="AAAA", max_lag=4, consistent_with="t")
    assert set(every) <= RANGE_READ.names and set(every) <= WINDOWS_READ.names
    assert set(read_params(max_lag=1, consistent_with="t")) <= LOOKUP.names
    assert "expected_version" in COMMAND.names
