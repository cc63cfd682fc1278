"""Ranges and windows on a cluster of three railway bookings instances (started once for the
module; the scenario that restarts an instance comes last)."""

from __future__ import annotations

import pytest
from pytest_bdd import scenarios

scenarios("ordered_cluster.feature")


# Each bookings module starts on empty bookings topics (features/steps/bookings_topics.py).
pytestmark = pytest.mark.usefixtures("empty_bookings_topics")
