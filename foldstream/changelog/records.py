"""The names of the headers foldstream writes on every changelog record (what each means:
:mod:`foldstream.changelog`), for its writers (:mod:`foldstream.changelog_batches`) and its
readers alike."""

from __future__ import annotations

from foldstream.stale_state import SOURCE_ID_HEADER as SOURCE_ID_HEADER  # re-exported

SOURCE_OFFSET_HEADER = "foldstream-source-offset"
FOLDED_FROM_HEADER = "foldstream-folded-from"
BATCH_START_HEADER = "foldstream-batch-start"
BATCH_END_HEADER = "foldstream-batch-end"
EPOCH_HEADER = "foldstream-epoch"
