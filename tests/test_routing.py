"""Redirect-on-miss responses: the hop counter, and a malformed one."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request

from foldstream.errors import InvalidRequest
from foldstream.routing import ANY_LAG, MAX_HOPS, Redirect, max_lag_param, redirect, within


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


def test_max_lag_is_a_count_or_any():
    assert max_lag_param(None) is None
    assert max_lag_param("0") == 0 and max_lag_param("1000") == 1000
    assert max_lag_param("any") == ANY_LAG
    for raw in ("ANY", "any ", "anyx", "-1", "", "1e3"):
        with pytest.raises(
            InvalidRequest, match="max_lag must be a non-negative integer .* or 'any'"
        ):
            max_lag_param(raw)


def test_a_copy_of_unknown_lag_answers_only_a_read_allowing_any():
    assert within(None, ANY_LAG) and within(10**9, ANY_LAG)
    assert within(0, 0) and within(5, 5) and not within(6, 5)
    assert not within(None, 5) and not within(None, 0)
    assert not within(0, None)  # no max_lag: only the active copy of a current owner
