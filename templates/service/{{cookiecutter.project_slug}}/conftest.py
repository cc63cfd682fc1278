"""The features run this service on real parts through foldstream's pytest plugin."""

from __future__ import annotations

import pytest

pytest_plugins = ["foldstream.testing.plugin"]


@pytest.fixture(scope="session")
def foldstream_service() -> str:
    """The service the steps of foldstream.testing.steps talk to."""
    return "{{ cookiecutter.package_name }}.query_api:service"
