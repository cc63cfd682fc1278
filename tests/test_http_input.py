"""The byte-string helpers of :mod:`foldstream.http_input` mean what the operators they replace
mean."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from foldstream.http_input import has_bytes


@given(st.binary(max_size=64), st.binary(max_size=4))
def test_has_bytes_is_the_in_operator(data: bytes, part: bytes) -> None:
    assert has_bytes(data, part) is (part in data)


def test_has_bytes_finds_the_percent_and_the_token_parameter() -> None:
    assert has_bytes(b"k-%2F1", b"%")
    assert not has_bytes(b"k-0001", b"%")
    assert has_bytes(b"max_lag=1&consistent_with=abc", b"consistent_with=")
    assert not has_bytes(b"", b"consistent_with=")
