"""Writing a store partition's changes to its changelog as one batch, the way every writer of a
store does it (a projection's tasks, the command side's aggregate snapshots): each record
stamped with the source offset the batch reaches, the one its writer folded from, the epoch of
the writer's hold and the id of the source topic, the first record opening the batch and the
last closing it. :class:`~foldstream.changelog.ChangelogFollower` applies such batches whole.
A writer commits its state only once every record of the batch is acknowledged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from foldstream.changelog import (
    BATCH_END_HEADER,
    BATCH_START_HEADER,
    EPOCH_HEADER,
    FOLDED_FROM_HEADER,
    SOURCE_OFFSET_HEADER,
)
from foldstream.kafka import produce_when_room
from foldstream.stale_state import SOURCE_ID_HEADER

Delivery = Callable[[Any, Any], None]


def batch_headers(
    source_offset: int, folded_from: int | None, epoch: int, source_id: str | None
) -> list[tuple[str, bytes]]:
    """The headers every record of a batch carries (``folded_from`` None: an empty store)."""
    headers = [
        (SOURCE_OFFSET_HEADER, str(source_offset).encode()),
        (FOLDED_FROM_HEADER, str(-1 if folded_from is None else folded_from).encode()),
        (EPOCH_HEADER, str(epoch).encode()),
    ]
    if source_id is not None:
        headers.append((SOURCE_ID_HEADER, source_id.encode()))
    return headers


def send_batch(
    producer: Any,
    topic: str,
    partition: int,
    changed: dict[bytes, bytes | None],
    headers: list[tuple[str, bytes]],
    on_delivery: Delivery,
) -> None:
    """Queue ``changed`` (a None value: a tombstone) for ``partition`` of ``topic``, each record
    with ``headers``, the first opening the batch and the last closing it: a copy applies a
    batch only once it has all of it."""
    if not changed:
        return
    opening, closing = (BATCH_START_HEADER, b"1"), (BATCH_END_HEADER, b"1")
    first_key, last_key = next(iter(changed)), next(reversed(changed))
    marked = {first_key: [*headers, opening]}
    marked[last_key] = [*marked.get(last_key, headers), closing]
    for key, value in changed.items():
        produce_when_room(
            producer,
            topic,
            wait_s=0.01,
            key=key,
            value=value,
            partition=partition,
            headers=marked.get(key, headers),
            on_delivery=on_delivery,
        )


def changelog_position(stored: int | None, landed: list[int]) -> int | None:
    """The changelog position to store with the state after its records ``landed``: where a
    copy made from this state resumes following the changelog.

    Right after the last of them when they follow the stored position directly, with nothing
    among them. Records of another writer before or among them (a previous owner writing late,
    a failed task's) are not in this state: the position then stays where it was, so that a
    copy following the changelog from it reads them (fencing and source offsets decide what it
    applies).
    """
    if not landed:
        return stored  # nothing written: every record of the chunk was a poison record
    first, last = min(landed), max(landed)
    alone = last - first + 1 == len(landed)  # offsets are unique: nothing else among them
    follows = first == (-1 if stored is None else stored) + 1
    return last if alone and follows else stored
