"""Standby copies: this member keeps a warm copy, from the changelogs, of each partition the
assignment names it a standby of (:class:`~foldstream.changelog.StandbyReplicas` follows them)."""

from __future__ import annotations

import threading

from foldstream.changelog import StandbyReplicas
from foldstream.cluster.handover import Handover
from foldstream.cluster.map import ClusterMap
from foldstream.cluster.ownership import TopicPartition


class StandbyKeeper:
    """Keeps exactly the copies the newest assignment asks of this member.

    ``copies_lock`` is held while choosing and opening copies, and by a takeover while it
    releases its partitions' copies: a copy chosen from a view older than the takeover is never
    opened after the takeover released it, nor while the takeover runs (both would open one
    RocksDB in this process).
    """

    def __init__(
        self,
        *,
        cluster_map: ClusterMap,
        handover: Handover,
        replicas: StandbyReplicas,
        copies_lock: threading.Lock,
    ) -> None:
        self._map = cluster_map
        self._handover = handover
        self.replicas = replicas
        self._copies_lock = copies_lock

    def keep(self) -> None:
        assignment = self._map.assignment()
        if assignment.generation == 0:
            return
        me = self._map.member_id
        with self._copies_lock:
            mine = self._handover.held() | assignment.owned_by(me)
            wanted = assignment.standby_of(me) - mine
            # Not one still held as active (its release is under way): both would open it.
            busy = self._handover.local.held() | self._handover.taking_over()
            self.replicas.assign(
                [key for key in self._handover.store_keys(wanted) if key not in busy]
            )

    def partitions(self) -> set[TopicPartition]:
        """Source partitions of which this member keeps a standby copy."""
        topic_of = {store: layout.source_topic for store, layout in self._handover.stores.items()}
        return {(topic_of[store], p) for store, p in self.replicas.held()}
