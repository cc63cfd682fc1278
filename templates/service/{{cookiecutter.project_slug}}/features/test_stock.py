"""Binds stock.feature; its steps come from foldstream's step library."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("stock.feature")
