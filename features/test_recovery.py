"""Projections recovering from failed micro-batches, on the flaky test service (its own
module, so its instance runs alone)."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("recovery.feature")
