"""Ranges and windows on a cluster of three railway bookings instances (started once for the
module; the scenario that restarts an instance comes last)."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("ordered_cluster.feature")
