"""The charts example on a 3-instance cluster, an instance killed with kill -9 mid-stream
(its own module: the cluster is started once for it, and stopped before other modules')."""

from __future__ import annotations

from pytest_bdd import scenarios

scenarios("charts_cluster.feature")
