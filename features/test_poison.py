"""Poison records on the events topic and on a queryable topic, on a service of their own
(its own module, so its instance runs alone)."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("poison.feature")
