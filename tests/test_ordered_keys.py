"""The ordered stores' key layout: byte order is sort key order, and no routing key's entries
mix with another's, whatever bytes keys and sort keys hold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foldstream.state.ordered_keys import (
    decode_int,
    decode_string,
    encode_int,
    encode_sort_key,
    entry_key,
    entry_prefix,
    expiry_key,
    prefix_end,
    read_varint,
    split_sort_key,
    varint,
    window_key,
    window_of_expiry,
)
from foldstream.times import MAX_MS, MIN_MS, iso_ms, iso_ms_bytes, to_epoch_ms

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
offsets = st.integers(min_value=0, max_value=2**63 - 1)


@given(int64, int64)
def test_integers_sort_as_their_bytes(a: int, b: int) -> None:
    assert (a < b) == (encode_int(a) < encode_int(b))
    assert decode_int(encode_int(a)) == a


@given(st.text(), st.text(), offsets, offsets)
def test_strings_sort_by_code_point_whatever_follows_them(a: str, b: str, x: int, y: int) -> None:
    """``\\x00`` inside a string, or a suffix after it, never changes the order."""
    key_a, key_b = (
        entry_key(b"k", encode_sort_key("string", a), x),
        entry_key(b"k", encode_sort_key("string", b), y),
    )
    if a != b:
        assert (a < b) == (key_a < key_b)
    assert decode_string(encode_sort_key("string", a)) == (a, len(encode_sort_key("string", a)))
    assert split_sort_key("string", encode_sort_key("string", a) + b"rest") == (a, b"rest")


@given(st.binary(max_size=300), st.binary(max_size=300), int64, int64)
def test_routing_keys_never_share_a_prefix(k1: bytes, k2: bytes, s1: int, s2: int) -> None:
    one, other = window_key(k1, s1), window_key(k2, s2)
    prefix = entry_prefix(k1)
    assert one.startswith(prefix) and prefix <= one < prefix_end(prefix)
    if k1 != k2:
        assert not (prefix <= other < prefix_end(prefix))


@given(st.integers(min_value=0, max_value=2**64))
def test_varints_read_back(n: int) -> None:
    assert read_varint(varint(n) + b"tail") == (n, len(varint(n)))


@given(st.binary(max_size=300), int64)
def test_the_expiry_index_names_its_window(key: bytes, start: int) -> None:
    assert window_of_expiry(expiry_key(start, key)) == window_key(key, start)


@given(st.lists(st.tuples(int64, st.binary(max_size=20)), min_size=2, max_size=20))
def test_the_expiry_index_is_in_window_start_order(windows: list[tuple[int, bytes]]) -> None:
    ordered = sorted(windows, key=lambda w: encode_int(w[0]))
    keys = [expiry_key(start, key) for start, key in ordered]
    starts = [decode_int(k[1:9]) for k in sorted(keys)]
    assert starts == sorted(start for start, _ in windows)


def test_times_in_and_out() -> None:
    assert to_epoch_ms("2026-05-01T10:15:00Z") == to_epoch_ms("2026-05-01T12:15:00+02:00")
    assert to_epoch_ms("2026-05-01T10:15:00") == to_epoch_ms("2026-05-01T10:15:00Z")  # UTC
    assert to_epoch_ms("1777630500123") == 1777630500123
    assert iso_ms(1777630500123) == "2026-05-01T10:15:00.123Z"
    assert iso_ms(-1) == "1969-12-31T23:59:59.999Z"
    assert to_epoch_ms(iso_ms(MIN_MS)) == MIN_MS and to_epoch_ms(iso_ms(MAX_MS)) == MAX_MS
    for bad in ("yesterday", "2026-13-01", "", MAX_MS + 1, True, 1.5, "9" * 70):
        with pytest.raises(ValueError):
            to_epoch_ms(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=MIN_MS, max_value=MAX_MS))
def test_times_formatted_by_day_are_the_same_text(ms: int) -> None:
    assert iso_ms_bytes(ms) == iso_ms(ms).encode()
    assert iso_ms_bytes(ms) == iso_ms(ms).encode()  # the day's date from the cache this time


def test_times_formatted_by_day_at_the_edges_and_out_of_range() -> None:
    for ms in (0, -1, 1, 86_399_999, 86_400_000, -86_400_000, MIN_MS, MAX_MS, 1777630500123):
        assert iso_ms_bytes(ms) == iso_ms(ms).encode()
    for bad in (MIN_MS - 1, MAX_MS + 86_400_000):
        with pytest.raises(OverflowError):
            iso_ms(bad)
        with pytest.raises(OverflowError):
            iso_ms_bytes(bad)


def test_no_key_follows_a_prefix_of_ff_bytes_only() -> None:
    assert prefix_end(b"a\xff") == b"b"
    with pytest.raises(ValueError):
        prefix_end(b"\xff\xff")
