"""Fixtures of the framework's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from foldstream import kafka_client


@pytest.fixture
def client_properties() -> Iterator[None]:
    """Restores this process's Kafka client properties after a test that installs others."""
    before = kafka_client.installed()
    try:
        yield
    finally:
        kafka_client.install(before)
