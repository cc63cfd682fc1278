"""Store partitions copied from their changelog topics: restores and warm standby replicas.

Every changelog record carries the source offset its value reflects (header
:data:`SOURCE_OFFSET_HEADER`) and the one its writer folded from (:data:`FOLDED_FROM_HEADER`,
-1 for an empty store). Applying changelog records therefore moves a local copy's values,
its source offset and its changelog offset together, in one write batch: a copy that becomes
active resumes the projection from exactly the source offset its values reflect.

Every record also carries the epoch of its writer's hold on the partition
(:data:`EPOCH_HEADER`): a new owner writes with an epoch above every earlier owner's, so the
records of a previous owner that goes on writing after losing the partition (a long pause: a
"zombie") are recognised and ignored instead of mixing into the copies.

And the id of the source topic it was folded from (:data:`SOURCE_ID_HEADER`): copies never
apply the values of an earlier topic of the same name. A copy is checked against its topics
before it is used (:mod:`foldstream.stale_state`).

The epochs are the copies' own check; the broker's is the changelog's writer
(:mod:`.writer`): one transactional producer per store partition, which the partition's next
owner fences before it restores its copy. A previous owner's late writes are then refused by
the broker, and a transaction of theirs left open is aborted: copies read ``read_committed``,
and the log cleaner drops aborted records, so compaction never keeps a late record in place of
the current owner's.

The parts: the headers (:mod:`.records`), where a store's state comes from
(:mod:`.layout`), applying records to a copy (:mod:`.follower`), restoring a copy to the
changelog's end (:mod:`.restore`), the warm standby copies (:mod:`.standby`) and the writer
(:mod:`.writer`).
"""

from __future__ import annotations

from foldstream.changelog.catalog import StoreCatalog
from foldstream.changelog.follower import ChangelogFollower
from foldstream.changelog.layout import StoreLayout
from foldstream.changelog.records import (
    BATCH_END_HEADER,
    BATCH_START_HEADER,
    EPOCH_HEADER,
    FOLDED_FROM_HEADER,
    SOURCE_ID_HEADER,
    SOURCE_OFFSET_HEADER,
)
from foldstream.changelog.restore import open_copy, restore
from foldstream.changelog.standby import StandbyReplicas
from foldstream.changelog.writer import ChangelogWriter

__all__ = [
    "BATCH_END_HEADER",
    "BATCH_START_HEADER",
    "EPOCH_HEADER",
    "FOLDED_FROM_HEADER",
    "SOURCE_ID_HEADER",
    "SOURCE_OFFSET_HEADER",
    "ChangelogFollower",
    "ChangelogWriter",
    "StandbyReplicas",
    "StoreCatalog",
    "StoreLayout",
    "open_copy",
    "restore",
]
