"""Routing, standby reads, failover and restores on a cluster of three storefront instances.

Its own module: the cluster is started once for it (the inventory instance of the other
modules is stopped first, as both are the "inventory" service); the scenarios that kill or
restart an instance come last.
"""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("cluster.feature")
