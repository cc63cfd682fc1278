"""The store host: the instance process holds its active partitions open, for as long as it
owns them, and serves them to the projection's Spark workers over a local connection.

Spark runs the fold in Python workers that alternate between micro-batches, so a worker could
not keep a partition open: opening and flush-closing it cost CPU and fsyncs per partition and
batch, and every commit made the query API reopen its snapshot (docs/decisions.md, "The store
host"). Now the fold
(in whichever worker) asks the host for the values a batch folds in one round trip and sends
the changes back in another; the host writes them with the source offset in one WriteBatch, as
the worker did, and lookups read the same open partition. The connection is
:mod:`multiprocessing.connection` (pickled tuples) authenticated by a key made per host; the
partition's owner (the cluster node) decides what is held, and a task's write is refused once
its partition moved. The tasks' side of the connection is :mod:`foldstream.state.host_client`.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any, NamedTuple

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from foldstream.errors import ConfigurationError
from foldstream.state.format import TABLE_FORMAT
from foldstream.state.held import HeldPartition, PartitionClosed
from foldstream.state.host_client import RemotePartition as RemotePartition  # re-exported
from foldstream.state.host_client import StoreHostError as StoreHostError  # re-exported
from foldstream.state.host_client import call_host as call_host  # re-exported
from foldstream.state.rocksdb import RocksDBWriter, is_lock_held, partition_path

log = logging.getLogger(__name__)
#: A held partition that no task wrote for this long has its memtable flushed (if it holds at
#: least as many writes as below): lookups then read table files only.
IDLE_FLUSH_S = 5.0
IDLE_FLUSH_ENTRIES = 1000

#: How long a new connection has for its handshake.
HANDSHAKE_TIMEOUT_S = 10.0

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})

StoreKey = tuple[str, int]
"""``(store, partition)``."""


class PartitionStop(NamedTuple):
    """Where a projection task stopped folding a partition (its store's ``on_error`` is
    ``stop``): at the source ``offset`` of the record it could not fold, with ``error``."""

    offset: int
    error: str


class StoreHost:
    """Holds partitions of stores under ``state_dir`` open and serves them to projection tasks
    at :attr:`address` (listening on ``host``, loopback by default: Spark executors on other
    machines need an address they can reach).

    Lifecycle: :meth:`start`; :meth:`open` / :meth:`close` as partitions come and go;
    :meth:`stop` closes everything. The connection carries pickles, authenticated by a key
    made per host but not encrypted: keep it on loopback or a network that only the cluster's
    machines reach. ``on_task(store, {step: seconds}, records)`` is called with each task's
    report of where its time went (:mod:`~foldstream.projections.task_steps`) and how many
    records it handled; ``on_poison(store, {outcome: records})`` with the poison records it
    dead-lettered or skipped, or the partitions it stopped (:mod:`~foldstream.projections.poison`);
    ``on_applied(store, partition, offset)`` after each task's write, with the source offset the
    partition reached (:class:`~foldstream.state.applied.AppliedOffsets`);
    ``on_late(store, records)`` with the records a windowed store's task dropped as late.
    ``formats`` names the format of each store that is not kept in the point stores'
    (:mod:`~foldstream.state.format`); ``unmapped`` holds the stores whose files are read
    without ``mmap`` (:func:`~foldstream.state.format.store_options`).

    A task that stops a partition (:meth:`stopped`) says so: the host then refuses that
    partition's reads and writes to every task, until it is closed (released, or the instance
    stops), while lookups still read it.
    """

    def __init__(
        self,
        *,
        state_dir: Path,
        host: str = "127.0.0.1",
        idle_flush_s: float = IDLE_FLUSH_S,
        idle_flush_entries: int = IDLE_FLUSH_ENTRIES,
        on_task: Callable[[str, Mapping[str, float], int], None] | None = None,
        on_poison: Callable[[str, Mapping[str, int]], None] | None = None,
        on_applied: Callable[[str, int, int], None] | None = None,
        on_late: Callable[[str, int], None] | None = None,
        formats: Mapping[str, str] | None = None,
        unmapped: Container[str] = (),
    ) -> None:
        self.state_dir = Path(state_dir)
        self.on_task = on_task
        self.on_poison = on_poison
        self.on_applied = on_applied
        self.on_late = on_late
        self.formats = formats if formats is not None else {}  # may gain stores: not copied
        self.unmapped = unmapped  # likewise
        self.host = host
        self.idle_flush_s = idle_flush_s
        self.idle_flush_entries = idle_flush_entries
        self.idle_flushes = 0  # memtables flushed because idle, for the curious (tests)
        self._stopped = threading.Event()
        self.authkey = secrets.token_bytes(32)
        self._held: dict[StoreKey, HeldPartition] = {}
        self._stops: dict[StoreKey, PartitionStop] = {}
        self._refused: set[str] = set()  # stores whose tasks are refused (:meth:`refuse`)
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self.address = ""

    def start(self) -> None:
        if self.host in _WILDCARDS:
            raise ConfigurationError(
                f"store_host {self.host!r} is a wildcard: Spark's tasks connect to the address "
                "given; name one of this machine's addresses they reach (127.0.0.1 for a local "
                "master)"
            )
        self._stopped.clear()
        server = socket.create_server((self.host, 0))
        self._server = server
        bound_host, port = server.getsockname()[:2]
        self.address = f"{bound_host}:{port}"
        threading.Thread(target=self._accept, name="store-host", daemon=True).start()
        threading.Thread(target=self._flush_idle, name="store-host-flush", daemon=True).start()

    def open(
        self, store: str, partition: int, *, identity: str, epoch: int, wait_s: float = 60.0
    ) -> int:
        """Hold ``(store, partition)`` open (no-op if it is) and return the epoch its changelog
        records are written with: ``epoch``, or above the newest epoch the copy has seen in the
        changelog. Waits while a previous writer, e.g. of an instance that was just killed,
        still holds the RocksDB lock."""
        with self._lock:
            if (store, partition) in self._held:
                return self._held[(store, partition)].epoch
            path = partition_path(self.state_dir, store, partition)
            for attempt in Retrying(
                stop=stop_after_delay(wait_s),
                wait=wait_exponential(multiplier=0.01, max=0.5),
                retry=retry_if_exception(is_lock_held),
                reraise=True,
            ):
                with attempt:
                    table_format = self.formats.get(store, TABLE_FORMAT)
                    writer = RocksDBWriter(
                        path,
                        identity=identity,
                        table_format=table_format,
                        mapped_reads=store not in self.unmapped,
                    )
            epoch = max(epoch, writer.changelog_epoch() + 1)
            self._held[(store, partition)] = HeldPartition(writer, f"{store}/{partition}", epoch)
            return epoch

    def close(self, keys: Iterable[StoreKey]) -> None:
        """Stop holding ``keys`` (flushed and closed once reads and writes under way end)."""
        wanted = set(keys)
        with self._lock:
            closing = [self._held.pop(key) for key in wanted if key in self._held]
            for key in wanted:
                self._stops.pop(key, None)  # a new hold folds from its stored offset again
        failed = []
        for held in closing:
            try:
                held.close()
            except Exception as exc:  # noqa: BLE001 - the others are closed all the same
                failed.append(exc)
        if failed:
            raise failed[0]

    def partition(self, store: str, partition: int) -> HeldPartition | None:
        """The held partition, or None if it is not held here."""
        return self._held.get((store, partition))

    def next_offset(self, store: str, partition: int) -> int | None:
        """The first source offset not in the held partition, or None if it is not held."""
        held = self._held.get((store, partition))
        try:
            return None if held is None else held.next_offset()
        except PartitionClosed:  # closed under this read
            return None

    def refuse(self, store: str) -> None:
        """Refuse every task's reads and writes of ``store`` from now on (a store version
        retired from a query it shares with other stores: its tasks skip it); lookups of its
        partitions still held are answered."""
        with self._lock:
            self._refused.add(store)

    def stopped(self) -> dict[StoreKey, PartitionStop]:
        """The held partitions a task stopped (store policy ``stop``), with where and why."""
        with self._lock:
            return dict(self._stops)

    def held(self) -> frozenset[StoreKey]:
        with self._lock:
            return frozenset(self._held)

    def stop(self) -> None:
        self._stopped.set()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.close(list(self._held))

    def _flush_idle(self) -> None:
        """Flush the memtables of partitions no task wrote for a while (see
        :meth:`HeldPartition.flush_if_idle`)."""
        while not self._stopped.wait(self.idle_flush_s / 4):
            for key, held in list(self._held.items()):
                try:
                    if held.flush_if_idle(self.idle_flush_s, self.idle_flush_entries):
                        self.idle_flushes += 1
                        log.debug("flushed the memtable of idle %s/%s", *key)
                except PartitionClosed:
                    pass  # moved meanwhile: closing it flushed it
                except Exception:  # noqa: BLE001 - lookups still work from the memtable
                    log.warning("could not flush idle partition %s/%s", *key, exc_info=True)

    def _held_or_closed(self, store: str, partition: int) -> HeldPartition:
        held = self._held.get((store, partition))
        if held is None:
            raise PartitionClosed(f"{store}/{partition} is not held by this instance")
        if store in self._refused:
            raise PartitionClosed(f"{store} is retired: its tasks are refused")
        stop = self._stops.get((store, partition))
        if stop is not None:
            raise PartitionClosed(
                f"{store}/{partition} stopped at offset {stop.offset} (on_error='stop'): "
                f"{stop.error}"
            )
        return held

    def _stop(self, store: str, partition: int, offset: int, error: str) -> None:
        with self._lock:
            self._held_or_closed(store, partition)
            self._stops[(store, partition)] = PartitionStop(offset, error)
        log.error(
            "store %s stopped folding partition %d at offset %d (on_error='stop'): %s; "
            "restart the instance once the cause is fixed",
            store,
            partition,
            offset,
            error,
        )

    def _accept(self) -> None:
        while (server := self._server) is not None:
            try:
                sock, _ = server.accept()
            except OSError:
                if self._server is None:
                    return  # stopped
                log.warning("store host could not accept a connection", exc_info=True)
                time.sleep(0.1)  # e.g. out of file descriptors: later accepts may succeed
                continue
            threading.Thread(
                target=self._serve, args=(sock,), name="store-host-connection", daemon=True
            ).start()

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(sock.detach())
        try:
            # A peer that never completes the handshake must not hold a thread forever.
            _set_receive_timeout(connection.fileno(), HANDSHAKE_TIMEOUT_S)
            deliver_challenge(connection, self.authkey)
            answer_challenge(connection, self.authkey)
            _set_receive_timeout(connection.fileno(), 0)
            while self._server is not None:
                connection.send(self._answer(connection.recv()))
        except (EOFError, OSError):
            pass  # the worker went away
        except Exception:  # noqa: BLE001 - an unauthenticated or broken client: drop it
            log.warning("store host dropped a connection", exc_info=True)
        finally:
            connection.close()

    def _report_task(
        self,
        store: str,
        seconds: Mapping[str, float],
        records: int,
        poison: Mapping[str, int] | None = None,
    ) -> None:
        # A task's report is for the metrics: a failing callback must never fail the task.
        try:
            if self.on_task is not None:
                self.on_task(store, seconds, records)
            if poison and self.on_poison is not None:
                self.on_poison(store, poison)
        except Exception:  # noqa: BLE001
            log.exception("recording a projection task's steps")

    def _report_late(self, store: str, records: int) -> None:
        if self.on_late is None:
            return
        try:
            self.on_late(store, records)
        except Exception:  # noqa: BLE001 - a metric must never fail the task
            log.exception("recording a projection task's late records")

    def _answer(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            kind, store, partition, *arguments = request
            if kind == "task":
                self._report_task(store, *arguments)
                return "ok", None
            if kind == "stop":
                self._stop(store, partition, *arguments)
                return "ok", None
            if kind == "late":
                self._report_late(store, *arguments)
                return "ok", None
            held = self._held_or_closed(store, partition)
            if kind == "read":
                return "ok", held.read(*arguments)
            if kind == "scan":
                return "ok", held.read_range(*arguments)
            if kind == "write":
                held.write(*arguments)
                if self.on_applied is not None:
                    self.on_applied(store, partition, arguments[3])  # the offset written
                return "ok", None
            return "error", f"unknown request {kind!r}"
        except PartitionClosed as exc:
            return "closed", str(exc)
        except Exception as exc:  # noqa: BLE001 - raised again in the task, which Spark retries
            log.exception("store host request failed")
            return "error", f"{type(exc).__name__}: {exc}"


def _set_receive_timeout(fileno: int, seconds: float) -> None:
    """The kernel's receive timeout (0: none), which keeps the descriptor blocking as
    :class:`Connection` needs (``settimeout`` would make it non-blocking)."""
    timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    with socket.socket(fileno=os.dup(fileno)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
