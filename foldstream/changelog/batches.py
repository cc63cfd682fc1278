"""A store partition's changes as one changelog batch: each record stamped with the source
offset the batch reaches, the one its writer folded from, the epoch of the writer's hold and the
id of the source topic, the first record opening the batch and the last closing it.
:class:`~foldstream.changelog.ChangelogFollower` applies such batches whole;
:class:`~foldstream.changelog.ChangelogWriter` writes them, one transaction each."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from foldstream.changelog.records import (
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
    changed: Mapping[bytes, bytes | None],
    headers: list[tuple[str, bytes]],
    on_delivery: Delivery,
) -> None:
    """Queue ``changed`` (a None value: a tombstone) for ``partition`` of ``topic``, each record
    with ``headers``, the first opening the batch and the last closing it: a copy applies a
    batch only once it has all of it."""
    if not changed:
        return
    opening, closing = (BATCH_START_HEADER, b"1"), (BATCH_END_HEADER, b"1")
    keys = list(changed)
    first_key, last_key = keys[0], keys[-1]
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
