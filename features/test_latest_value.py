"""Latest-value stores over foreign topics, on the prices example (its own module, so the
inventory instance is stopped before this one starts)."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("latest_value.feature")
