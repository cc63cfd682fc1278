"""Settings from keywords and ``FOLDSTREAM_*`` variables: the micro-batch cap, the wait for
the broker at startup."""

from __future__ import annotations

import pytest

from foldstream.errors import ConfigurationError
from foldstream.settings import MAX_BATCH_RECORDS, Settings


def test_the_micro_batch_cap_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOLDSTREAM_BATCH_RECORDS_PER_PARTITION", "20000")
    assert Settings.from_env().batch_records_per_partition == 20_000


@pytest.mark.parametrize("cap", [0, -1, MAX_BATCH_RECORDS + 1])
def test_a_micro_batch_cap_out_of_bounds_is_refused(cap: int) -> None:
    with pytest.raises(ConfigurationError, match="batch_records_per_partition must be"):
        Settings(batch_records_per_partition=cap)


def test_a_micro_batch_cap_that_is_no_number_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FOLDSTREAM_BATCH_RECORDS_PER_PARTITION", "lots")
    with pytest.raises(ConfigurationError, match="FOLDSTREAM_BATCH_RECORDS_PER_PARTITION"):
        Settings.from_env()


def test_the_wait_for_the_broker_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().broker_wait_s == 30
    monkeypatch.setenv("FOLDSTREAM_BROKER_WAIT_S", "120")
    assert Settings.from_env().broker_wait_s == 120
    monkeypatch.setenv("FOLDSTREAM_BROKER_WAIT_S", "soon")
    with pytest.raises(ConfigurationError, match="FOLDSTREAM_BROKER_WAIT_S"):
        Settings.from_env()


@pytest.mark.parametrize("seconds", [0, -1, 3601])
def test_a_wait_for_the_broker_out_of_bounds_is_refused(seconds: int) -> None:
    with pytest.raises(ConfigurationError, match="broker_wait_s must be 1..3600"):
        Settings(broker_wait_s=seconds)
