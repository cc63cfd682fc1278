"""The store host's client side, in projection tasks: requests to a
:class:`~foldstream.state.host.StoreHost` over its authenticated connection, and the partition
a task folds into through them (:class:`RemotePartition`)."""

from __future__ import annotations

from multiprocessing.connection import Client, Connection
from typing import Any

from foldstream.errors import FoldstreamError
from foldstream.state.base import Entries, PartitionWriter, overlay_scan
from foldstream.state.held import PartitionClosed

#: How long a task waits for the host's answer.
REQUEST_TIMEOUT_S = 120.0


class StoreHostError(FoldstreamError):
    """The store host failed a projection task's request (the task fails and Spark retries it).

    Remedy: read the instance's log for the cause (e.g. a full disk).
    """


_connections: dict[str, Connection] = {}


def call_host(address: str, authkey: bytes, request: tuple[Any, ...]) -> Any:
    """Send ``request`` to the host at ``address`` and return its answer; one connection per
    address and Spark worker, kept for the worker's life."""
    connection = _connections.get(address)
    if connection is None:
        host, _, port = address.rpartition(":")
        connection = Client((host, int(port)), authkey=authkey)
        _connections[address] = connection
    try:
        connection.send(request)
        if not connection.poll(REQUEST_TIMEOUT_S):
            raise TimeoutError(f"store host {address} did not answer in {REQUEST_TIMEOUT_S}s")
        status, answer = connection.recv()
    except (EOFError, OSError):
        _connections.pop(address, None)
        connection.close()
        raise
    if status == "closed":
        raise PartitionClosed(answer)
    if status != "ok":
        raise StoreHostError(answer)
    return answer


class RemotePartition(PartitionWriter):
    """A partition held by a :class:`StoreHost`, as a projection task sees it: the values of
    ``keys`` (those the task folds) read in one round trip, its changes written in another."""

    def __init__(
        self, address: str, authkey: bytes, store: str, partition: int, keys: list[bytes]
    ) -> None:
        self._call = (address, authkey)
        self._target = (store, partition)
        state, values = call_host(address, authkey, ("read", store, partition, keys))
        self._token: str = state.token
        #: The epoch of the hold: every changelog record of this partition carries it.
        self.epoch: int = state.epoch
        #: The id of the source topic the partition is built from (None: unknown): every
        #: changelog record of this partition carries it too.
        self.source_id: str | None = state.source_id
        self._applied: int | None = state.applied_offset
        self._changelog: int | None = state.changelog_offset
        self._values: dict[bytes, bytes | None] = dict(zip(keys, values, strict=True))
        self._changes: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self._changes:
            return self._changes[key]
        if key not in self._values:
            state, (value,) = call_host(*self._call, ("read", *self._target, [key]))
            if (state.token, state.applied_offset) != (self._token, self._applied):
                raise PartitionClosed(f"{self._target} was written or moved since it was read")
            self._values[key] = value
        return self._values[key]

    def scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        """The entries of ``[start, end)`` as this task's changes leave them (committed ones
        read from the host, a page per round trip)."""
        return overlay_scan(self._committed_scan, self._changes, start, end, limit)

    def _committed_scan(self, start: bytes, end: bytes, limit: int) -> Entries:
        state, entries = call_host(*self._call, ("scan", *self._target, start, end, limit))
        if (state.token, state.applied_offset) != (self._token, self._applied):
            raise PartitionClosed(f"{self._target} was written or moved since it was read")
        return entries  # type: ignore[no-any-return]

    def put(self, key: bytes, value: bytes) -> None:
        self._changes[key] = value

    def delete(self, key: bytes) -> None:
        self._changes[key] = None

    def applied_offset(self) -> int | None:
        return self._applied

    def changelog_offset(self) -> int | None:
        return self._changelog

    def commit(self, offset: int, *, changelog_offset: int | None = None) -> None:
        call_host(
            *self._call,
            ("write", *self._target, self._token, self._applied, self._changes, offset)
            + (changelog_offset,),
        )
        self._values.update(self._changes)
        self._changes = {}
        self._applied = offset
        if changelog_offset is not None:
            self._changelog = changelog_offset

    def close(self) -> None:
        self._changes = {}
