"""Instances of one service sharing its partitions: membership, the cluster map, the node."""

from __future__ import annotations

from foldstream.cluster.map import ClusterMap, MemberState
from foldstream.cluster.membership import GroupMembership
from foldstream.cluster.node import ClusterNode

__all__ = ["ClusterMap", "ClusterNode", "GroupMembership", "MemberState"]
