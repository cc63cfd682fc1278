"""Windowed aggregates on the inventory example's sales_10m (an instance of its own: the sales
dated in the next century move its partitions' stream times)."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("windows.feature")
