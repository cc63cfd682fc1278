"""The framework's tests use its own pytest plugin, the one generated services load too."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "foldstream.testing.plugin",
    "foldstream.testing.cluster_plugin",
    "features.steps.recovery_steps",
    "features.steps.pause_steps",
    "features.steps.held_standby_steps",
    "features.steps.rebuild_steps",
    "features.steps.bookings_topics",
]


@pytest.fixture(scope="session")
def foldstream_service() -> str:
    """Features run the inventory example unless a step names another service."""
    return "foldstream.examples.inventory:service"
