"""What every state store implementation provides: one store per source partition.

A partition's state and the source offset it reflects change together, atomically: a writer
buffers puts and deletes and :meth:`PartitionWriter.commit` writes them with the offset in one
batch. A crash therefore leaves either the old state and old offset or the new ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Self

Entries = list[tuple[bytes, bytes]]
"""``(key, value)`` pairs in key order: what a range read returns."""


class PartitionReader(ABC):
    """Read access to one partition's state, possibly from another process than the writer."""

    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The stored value of ``key``, or None."""

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The stored values of ``keys`` (None where missing), in their order."""
        return [self.get(key) for key in keys]

    def scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        """Up to ``limit`` entries whose keys are in ``[start, end)``, in key order: the stores
        of an ordered format (:mod:`foldstream.state.format`) read ranges."""
        raise NotImplementedError(f"{type(self).__name__} does not read ranges")

    @abstractmethod
    def applied_offset(self) -> int | None:
        """The last source offset reflected in the state, or None before the first commit."""

    @abstractmethod
    def changelog_offset(self) -> int | None:
        """The last changelog offset reflected in the state (written or restored), or None."""

    def next_offset(self) -> int:
        """The first source offset not yet reflected in the state (0 before any commit)."""
        applied = self.applied_offset()
        return 0 if applied is None else applied + 1

    @abstractmethod
    def refresh(self) -> None:
        """Make the writer's latest commit visible (no-op where reads are always current)."""

    @abstractmethod
    def close(self) -> None:
        """Release the partition."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PartitionWriter(PartitionReader):
    """The single writer of one partition's state."""

    @abstractmethod
    def put(self, key: bytes, value: bytes) -> None:
        """Buffer a new value; visible to this writer's :meth:`get` at once."""

    @abstractmethod
    def delete(self, key: bytes) -> None:
        """Buffer a deletion; visible to this writer's :meth:`get` at once."""

    @abstractmethod
    def commit(self, offset: int, *, changelog_offset: int | None = None) -> None:
        """Write the buffered changes, ``offset`` and ``changelog_offset`` atomically. A crashed
        process loses none of it; a machine crash may lose the last commits, values and offsets
        together, which the projection folds again (or a restore copies) from Kafka."""

    def refresh(self) -> None:
        return None


def overlay_scan(
    committed: Callable[[bytes, bytes, int], Entries],
    pending: Mapping[bytes, bytes | None],
    start: bytes,
    end: bytes,
    limit: int,
) -> Entries:
    """What a writer's :meth:`PartitionReader.scan` sees: the ``committed`` entries of
    ``[start, end)`` with its ``pending`` changes (None: deleted) laid over them, up to
    ``limit``. Each round reads a page of committed entries and settles every key up to the
    page's last one, so a page full of keys deleted since is read past, never answered short."""
    found: Entries = []
    cursor = start
    while len(found) < limit:
        page = committed(cursor, end, limit)
        full = len(page) == limit
        merged = dict(page)
        for key, value in pending.items():
            if cursor <= key < end and (not full or key <= page[-1][0]):
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
        found += sorted(merged.items())[: limit - len(found)]
        if not full:
            break
        cursor = page[-1][0] + b"\x00"  # the first key after the page's last
    return found
