"""Commands, queries and projections on the inventory example (one instance for the module).

Steps: ``foldstream.testing.steps``, loaded by the plugin in the root conftest.py.
"""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("commands.feature", "queries.feature", "projections.feature", "metrics.feature")
