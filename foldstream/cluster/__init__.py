"""Instances of one service sharing its partitions: the map, the assignment, the node."""

from __future__ import annotations

from foldstream.cluster.assignment import Assignment
from foldstream.cluster.map import ClusterMap, MemberState
from foldstream.cluster.node import ClusterNode

__all__ = ["Assignment", "ClusterMap", "ClusterNode", "MemberState"]
