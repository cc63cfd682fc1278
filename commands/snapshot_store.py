"""The aggregate store: each events partition's aggregate snapshots in a store partition that
the instance's store host holds while it owns the partition, like a projection's.

The cluster treats it as one more store of the events topic (named :data:`AGGREGATE_STORE`,
changelog ``<service>._aggregates.changelog``): a takeover restores the tail of its changelog a
local copy lacks and holds it before the command side takes the partition, other instances keep
standby copies of it, and a copy that does not belong to its topics is rebuilt
(:mod:`foldstream.stale_state`). The command side reads snapshots from the held partition and
writes them as a projection's task writes values, through the hold: the changed keys to the
changelog as one batch in one transaction of the partition's fenced changelog writer
(:class:`~foldstream.changelog.ChangelogWriter`), then values and source offset (the offset of
the last event they reflect) in one RocksDB write batch.
"""

from __future__ import annotations

from foldstream.settings import AGGREGATE_STORE
from foldstream.state.held import HeldPartition, PartitionClosed
from foldstream.state.host import StoreHost

#: The largest snapshot kept (with its key, a changelog record of librdkafka's default
#: ``message.max.bytes`` less room for the headers).
MAX_SNAPSHOT_BYTES = 1_000_000 - 8192


class SnapshotPartition:
    """One held partition of the aggregate store, as the command side reads and writes it."""

    def __init__(self, held: HeldPartition, partition: int) -> None:
        self._held = held
        self.partition = partition

    def position(self) -> int | None:
        """The offset of the last event the snapshots reflect (None: none yet)."""
        return self._held.applied_offset()

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._held.get_many(keys)

    def write(self, changes: dict[bytes, bytes | None], offset: int) -> None:
        """Write ``changes`` (a None value deletes) as the state after the event at source
        ``offset``: to the changelog first, committed, then with ``offset`` in one write
        batch. :class:`PartitionClosed` if the partition is no longer held here, or another
        instance fenced its changelog (nothing is written then), :class:`BrokerUnavailable` if
        the changelog did not take them."""
        state, _ = self._held.read([])
        self._held.write(state.token, state.applied_offset, changes, offset)


class SnapshotStore:
    """The aggregate store's partitions that ``host`` holds (each writing its changelog through
    the writer its takeover fenced with)."""

    def __init__(self, host: StoreHost) -> None:
        self.host = host

    def partition(self, partition: int) -> SnapshotPartition:
        """The held partition; :class:`PartitionClosed` if the host does not hold it (the
        cluster holds it before it gives the events partition to the command side)."""
        held = self.host.partition(AGGREGATE_STORE, partition)
        if held is None:
            raise PartitionClosed(f"{AGGREGATE_STORE}/{partition} is not held by this instance")
        return SnapshotPartition(held, partition)
