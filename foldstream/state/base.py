"""What every state store implementation provides: one store per source partition.

A partition's state and the source offset it reflects change together, atomically: a writer
buffers puts and deletes and :meth:`PartitionWriter.commit` writes them with the offset in one
batch. A crash therefore leaves either the old state and old offset or the new ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class PartitionReader(ABC):
    """Read access to one partition's state, possibly from another process than the writer."""

    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The stored value of ``key``, or None."""

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The stored values of ``keys`` (None where missing), in their order."""
        return [self.get(key) for key in keys]

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
