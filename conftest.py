"""Fixtures on real parts: one embedded broker per test session, instances as child processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from foldstream.broker import EmbeddedBroker
from foldstream.process import InstanceProcess


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as running:
        yield running


@pytest.fixture(scope="module")
def inventory(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InstanceProcess]:
    """A running inventory instance; each module gets its own (and its own state directory)."""
    state = tmp_path_factory.mktemp("inventory") / "state"
    with InstanceProcess(bootstrap=broker.bootstrap, state_dir=state, partitions=4) as instance:
        instance.wait_ready()
        yield instance
