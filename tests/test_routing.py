"""Redirect-on-miss responses: the hop counter, and a malformed one."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request

from foldstream.routing import MAX_HOPS, Redirect, redirect


def _request(query: str) -> Request:
    path = "/stores/stock/keys/sku%2F1"
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/stores/stock/keys/sku/1",
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "headers": [],
        }
    )


def test_redirect_keeps_the_raw_path_and_query_and_counts_the_hop():
    response = redirect(_request("max_lag=5&hops=1"), Redirect(2, "http://127.0.0.1:8001/"))
    assert response.status_code == 307
    assert response.headers["location"] == (
        "http://127.0.0.1:8001/stores/stock/keys/sku%2F1?max_lag=5&hops=2"
    )
    assert response.headers["cache-control"] == "no-store"


def test_too_many_hops_is_503_with_retry_after():
    response = redirect(_request(f"hops={MAX_HOPS}"), Redirect(2, "http://127.0.0.1:8001"))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"


@pytest.mark.parametrize("hops", ["x", "-1", "1.5", "²", "9" * 5000, "1_0"])
def test_a_malformed_hop_counter_is_400(hops: str):
    response = redirect(_request(f"hops={hops}"), Redirect(2, "http://127.0.0.1:8001"))
    assert response.status_code == 400
    assert "hops must be a non-negative integer" in json.loads(response.body)["error"]
