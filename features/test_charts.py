"""The charts example's re-keyed, chained and joined stores on one instance (its own module, so
other services' instances are stopped before this one starts)."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("charts.feature")
