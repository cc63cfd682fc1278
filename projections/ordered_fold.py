"""Folding a chunk into an ordered or windowed store (:class:`OrderedStore`), whose records may
each change several stored keys: the whole chunk at once, and record by record only when that
raises, so that one poison record meets the store's ``on_error`` as a point store's does and
the records around it are folded."""

from __future__ import annotations

from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable
from foldstream.projections.chunks import Records
from foldstream.projections.ordered import OrderedStore
from foldstream.projections.poison import STOPPED, PoisonPolicy, ValueTooLarge, describe
from foldstream.projections.task_output import MAX_VALUE_BYTES, Folded
from foldstream.state import PartitionWriter
from foldstream.state.base import Entries, overlay_scan
from foldstream.state.host import PartitionClosed, PartitionStop


class StagedChanges(PartitionWriter):
    """Changes laid over ``writer`` and kept apart until :meth:`apply`: what a fold that raised
    wrote is dropped with it."""

    def __init__(self, writer: PartitionWriter) -> None:
        self.writer = writer
        self.changes: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.changes[key] if key in self.changes else self.writer.get(key)

    def scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        return overlay_scan(self.writer.scan, self.changes, start, end, limit)

    def put(self, key: bytes, value: bytes) -> None:
        self.changes[key] = value

    def delete(self, key: bytes) -> None:
        self.changes[key] = None

    def applied_offset(self) -> int | None:
        return self.writer.applied_offset()

    def changelog_offset(self) -> int | None:
        return self.writer.changelog_offset()

    def commit(self, offset: int, *, changelog_offset: int | None = None) -> None:
        raise TypeError("staged changes are applied to their writer, which commits them")

    def refresh(self) -> None:
        return None

    def close(self) -> None:
        return None

    def apply(self) -> None:
        """Hand the staged changes to the writer (still uncommitted there)."""
        for key, value in self.changes.items():
            if value is None:
                self.writer.delete(key)
            else:
                self.writer.put(key, value)


def fold_ordered(
    projection: OrderedStore,
    writer: PartitionWriter,
    fresh: Records,
    folded: Folded,
    poison: PoisonPolicy | None,
) -> dict[bytes, bytes | None]:
    """Fold ``fresh`` into ``writer`` (uncommitted), counting into ``folded``; the stored keys
    changed (None: deleted). A record error is raised when ``poison`` is None."""
    staged = StagedChanges(writer)
    try:
        chunk = projection.fold_chunk(staged, fresh)
        _check_sizes(chunk.changed)
    except (BrokerUnavailable, PartitionClosed):
        raise
    except Exception:
        if poison is None:
            raise
        return _record_by_record(projection, writer, fresh, folded, poison)
    staged.apply()
    folded.late += chunk.late
    folded.applied, folded.last_offset = len(fresh), fresh[-1][0]
    return chunk.changed


def _record_by_record(
    projection: OrderedStore,
    writer: PartitionWriter,
    fresh: Records,
    folded: Folded,
    poison: PoisonPolicy,
) -> dict[bytes, bytes | None]:
    changed: dict[bytes, bytes | None] = {}
    for offset, record in fresh:
        staged = StagedChanges(writer)
        try:
            chunk = projection.fold_chunk(staged, [(offset, record)])
            _check_sizes(chunk.changed)
        except (BrokerUnavailable, PartitionClosed):
            raise
        except Exception as error:  # noqa: BLE001 - any error of the record's is the policy's
            if handle_poison(folded, poison, offset, record, error):
                break
        else:
            staged.apply()
            changed.update(chunk.changed)
            folded.late += chunk.late
        folded.applied, folded.last_offset = folded.applied + 1, offset
    return changed


def _check_sizes(changed: dict[bytes, bytes | None]) -> None:
    for key, value in changed.items():
        if len(key) + len(value or b"") > MAX_VALUE_BYTES:
            raise ValueTooLarge(
                f"an entry under {key[:100]!r} would take {len(key) + len(value or b'')} bytes "
                f"with its key, more than a changelog record may ({MAX_VALUE_BYTES})"
            )


def handle_poison(
    folded: Folded, poison: PoisonPolicy, offset: int, record: EventRecord, error: Exception
) -> bool:
    """Handle the poison record at ``offset`` by the store's policy, recorded in ``folded``;
    True when the partition stops before it (policy ``stop``)."""
    if poison.on_error == "stop":
        folded.stop = PartitionStop(offset, describe(error))
        folded.outcomes[STOPPED] += 1
        return True
    folded.outcomes[poison.handle(offset, record, error, folded.on_delivery)] += 1
    folded.dead_letters = poison.producer
    return False
