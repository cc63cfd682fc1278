"""The cluster sentences of the step library, for features that run several instances of a
service (routing, standby reads, failover, restores, joiners): load it beside the plugin, in
the project's root ``conftest.py``::

    pytest_plugins = ["foldstream.testing.plugin", "foldstream.testing.cluster_plugin"]

Its sentences are listed in :mod:`foldstream.testing.cluster_steps`.
"""

from __future__ import annotations

pytest_plugins = [  # a module before those that import it, so that pytest rewrites its asserts
    "foldstream.testing.cluster_steps",
    "foldstream.testing.cluster_checks",
    "foldstream.testing.failover_checks",
]
