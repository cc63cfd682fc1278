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

The parts: the headers (:mod:`.records`), where a store's state comes from
(:mod:`.layout`), applying records to a copy (:mod:`.follower`), restoring a copy to the
changelog's end (:mod:`.restore`) and the warm standby copies (:mod:`.standby`).
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

__all__ = [
    "BATCH_END_HEADER",
    "BATCH_START_HEADER",
    "EPOCH_HEADER",
    "FOLDED_FROM_HEADER",
    "SOURCE_ID_HEADER",
    "SOURCE_OFFSET_HEADER",
    "ChangelogFollower",
    "StandbyReplicas",
    "StoreCatalog",
    "StoreLayout",
    "open_copy",
    "restore",
]
