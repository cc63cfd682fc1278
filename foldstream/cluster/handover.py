"""Following the assignment: giving partitions up, claiming them, taking them over.

Two threads drive :class:`~foldstream.cluster.ownership.Ownership`: the reconcile loop (woken by
every change of the cluster map) releases what the newest assignment takes away, says it applied
that assignment, and claims what it gives once the others have released it; the takeover loop
restores claimed partitions from their changelogs (only the tail a local copy lacks), holds them
open and starts serving them.

Whatever writes a partition (the projections, the command handler) is kept in line with the
partitions served by :meth:`Handover.sync`, which applies the *current* state, under one lock:
each state change is followed by a sync, so the last sync always reflects the last change, and a
sync computed from an older view can never undo a newer one (which once left a partition served
but no longer folded).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from foldstream.changelog import StoreLayout
from foldstream.cluster.map import ClusterMap
from foldstream.cluster.ownership import Ownership, TopicPartition, TopicPartitions, by_topic
from foldstream.cluster.versions import VersionSwitch
from foldstream.errors import FoldstreamError
from foldstream.state.local import LocalStores

log = logging.getLogger(__name__)


class ViewNotCurrent(FoldstreamError):
    """A takeover ended while this member's cluster view was not current (it stood still past
    the session timeout): it serves none of the partitions, which are claimed again once it
    is. Expected after a pause, so logged without a traceback."""


RECONCILE_INTERVAL_S = 0.1


class Projections(Protocol):
    """The projections (:class:`~foldstream.projections.runner.ProjectionRunner`)."""

    def run(self, owned: Mapping[str, Iterable[int]]) -> None: ...

    def failure(self, counts: Callable[[str], bool] = ...) -> str | None: ...

    def retire(self, store: str) -> None: ...


class CommandPartitions(Protocol):
    """The command side (:class:`~foldstream.commands.CommandHandler`)."""

    def own(self, partitions: Iterable[int]) -> None: ...

    def owned(self) -> frozenset[int]: ...

    def idempotency_retention_s(self) -> float: ...


class Copies(Protocol):
    """Standby copies a takeover releases first (:class:`~foldstream.changelog.StandbyReplicas`)."""

    def release(self, keys: Iterable[tuple[str, int]]) -> None: ...


Restore = Callable[[str, int], int]
"""``(store, partition) -> changelog records read`` bringing the local copy up to date."""


class Handover:
    """Keeps this member's partitions in line with the newest assignment."""

    def __init__(
        self,
        *,
        ownership: Ownership,
        cluster_map: ClusterMap,
        stores: Mapping[str, StoreLayout],
        versions: VersionSwitch,
        local: LocalStores,
        copies: Copies,
        copies_lock: threading.Lock,
        restore: Restore,
        projections: Projections,
        commands: CommandPartitions | None,
        events_topic: str,
        publish: Callable[[], None],
    ) -> None:
        self.ownership = ownership
        self._map = cluster_map
        self.stores = stores  # a catalog that may gain stores: not copied
        self.versions = versions
        self.local = local
        self._copies = copies
        self._copies_lock = copies_lock
        self._restore = restore
        self.projections = projections
        self.commands = commands
        self.events_topic = events_topic
        self._publish = publish
        self.lock = threading.RLock()  # guards ownership
        self._sync_lock = threading.Lock()
        self._gains: queue.Queue[TopicPartitions | None] = queue.Queue()
        self.wake = threading.Event()
        self._stopping = threading.Event()
        self._failures: dict[TopicPartition, str] = {}  # the last failed takeover of each
        # Store partitions a takeover is restoring and opening: no standby copy of them may be
        # opened meanwhile (one RocksDB, opened twice in this process, fails the takeover).
        self._taking_over: set[tuple[str, int]] = set()
        self._threads = [
            threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True),
            threading.Thread(target=self._take_over_loop, name="takeover", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop following the assignment and give everything up."""
        self._stopping.set()
        self.wake.set()
        self._gains.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        self.give_up(self.held())

    def failure(self) -> str | None:
        """Why a takeover of a partition still to be taken over failed last, if it did."""
        with self.lock:
            # Only of partitions still claimed here: one given away since is not ours to fail.
            claimed = self.ownership.held()
            for key, reason in sorted(self._failures.items()):
                if key in claimed and key not in self.ownership.serving:
                    return reason
        return None

    def taking_over(self) -> set[tuple[str, int]]:
        """Store partitions a takeover is restoring and opening now (call under the copies
        lock, as :meth:`_take_over` changes them under it)."""
        return set(self._taking_over)

    def held(self) -> TopicPartitions:
        with self.lock:
            return self.ownership.held()

    def store_keys(self, partitions: Iterable[TopicPartition]) -> list[tuple[str, int]]:
        """``(store, partition)`` of every store folding the given source partitions (a
        retired store version folds none)."""
        return [
            (store, p)
            for topic, p in partitions
            for store, layout in self.stores.items()
            if layout.source_topic == topic and not self.versions.is_retired(store)
        ]

    # -- following the assignment ------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        while not self._stopping.is_set():
            self.wake.wait(RECONCILE_INTERVAL_S)
            self.wake.clear()
            if self._stopping.is_set() or not self._map.caught_up():
                continue
            try:
                self.reconcile()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("following the assignment failed")

    def reconcile(self) -> None:
        assignment = self._map.assignment()
        with self.lock:
            lost = self.ownership.lost(assignment)
            self.ownership.release(lost)
        if lost:
            self.sync()
        with self.lock:
            applied = self.ownership.apply(assignment)
        if lost or applied:
            self._publish()  # only now: what it gave up is no longer written here
        if not self._map.view_is_current():
            # After a pause the assignment read may be one the others replaced meanwhile:
            # claiming from it would fence the new owner's writer (a 503 for its next command).
            return
        with self.lock:
            claimable = self.ownership.claimable(assignment, self._map.members(), time.monotonic())
            if claimable:
                self.ownership.claim(claimable, self._map.max_epoch())
        if claimable:
            self._publish()
            self._gains.put(claimable)

    def give_up(self, keys: TopicPartitions) -> None:
        """Stop serving ``keys`` and writing them; only then may another member take them."""
        with self.lock:
            self.ownership.release(keys)
        self.sync()
        self._publish()

    def sync(self) -> None:
        """Make the projections, the command handler and the held store partitions match what
        is served (and restored) now."""
        with self._sync_lock:
            with self.lock:
                serving = set(self.ownership.serving)
            # Commands first: a partition given up takes no command from here on, while the
            # projections may wait for a running micro-batch to end.
            if self.commands is not None:
                self.commands.own(p for t, p in serving if t == self.events_topic)
            self.projections.run(by_topic(serving))
            with self.lock:  # read now, not before the runs above: a claim since is kept
                claimed = set(self.ownership.held())
            # A partition released since ``serving`` was read keeps its copies until the next
            # sync (every release is followed by one): its command writer and projection, left
            # to that sync too, still write into them meanwhile.
            wanted = set(self.store_keys(claimed | serving))
            unwanted = [key for key in self.local.held() if key not in wanted]
            if unwanted:
                self.local.release(unwanted)

    def hold_added(self) -> list[tuple[str, int]]:
        """Hold the copies of stores added since this member took its partitions over (a
        rebuild generation, :mod:`.rebuilds`) on the partitions it serves, restored from their
        changelogs, and fold them from there (their projections start from the copies'
        offsets); returns them. A takeover holds every store of the catalog already."""
        with self.lock:
            serving = set(self.ownership.serving)
        missing = [key for key in self.store_keys(serving) if not self.local.holds(*key)]
        if not missing:
            return []
        with self._copies_lock:
            self._taking_over.update(missing)
            self._copies.release(missing)
        try:
            held = [key for key in missing if self._hold_added(*key)]
        finally:
            with self._copies_lock:
                self._taking_over.difference_update(missing)
        self.sync()
        return held

    def _hold_added(self, store: str, partition: int) -> bool:
        topic = self.stores[store].source_topic
        self._restore(store, partition)
        with self._sync_lock:  # not while a sync releases what is no longer served
            with self.lock:
                epoch = self.ownership.epoch
                if (topic, partition) not in self.ownership.serving:
                    return False
            identity = self.stores[store].identity(partition)
            held = self.local.hold(store, partition, identity=identity, epoch=epoch)
        with self.lock:
            # Records are written with the epoch the copy needs; the member publishes it.
            self.ownership.epoch = max(self.ownership.epoch, held)
        log.info("holding %s/%d, added since its partition was taken over", store, partition)
        return True

    # -- taking over -------------------------------------------------------------------------

    def _take_over_loop(self) -> None:
        while not self._stopping.is_set():
            gained = self._gains.get()
            if gained is None:
                return
            try:
                self._take_over(gained)
            except Exception as exc:  # noqa: BLE001 - reported through /ready and the log
                with self.lock:
                    delay = self.ownership.takeover_failed(gained, time.monotonic())
                    reason = f"taking over {sorted(gained)} failed: {type(exc).__name__}: {exc}"
                    self._failures.update(dict.fromkeys(gained, reason))
                if isinstance(exc, ViewNotCurrent):  # expected after a pause: no traceback
                    log.warning("%s; claiming %s again in %.1fs", exc, sorted(gained), delay)
                else:
                    log.exception(
                        "taking over %s failed; claiming again in %.1fs", sorted(gained), delay
                    )
                self.sync()  # releases what it held of them
                self._publish()
                self.wake.set()

    def _take_over(self, gained: TopicPartitions) -> None:
        started = time.monotonic()
        keys = self.store_keys(gained)
        with self._copies_lock:
            self._taking_over.update(keys)
            self._copies.release(keys)
        try:
            self._restore_and_hold(gained, keys, started)
        finally:
            with self._copies_lock:
                self._taking_over.difference_update(keys)

    def _restore_and_hold(
        self, gained: TopicPartitions, keys: list[tuple[str, int]], started: float
    ) -> None:
        with self.lock:
            epoch = self.ownership.epoch
        restored = 0
        for store, partition in keys:
            if self.versions.is_retired(store):
                continue  # retired since the takeover began: its directory goes
            # Checked once no sync is under way: a sync that read the claims before this
            # takeover claimed the partition releases it at its end, and a copy found still held
            # here (given up a moment ago, a pause) would then be gone, never folded again.
            with self._sync_lock:
                if self.local.holds(store, partition):
                    continue  # still held (taken again right after it was given up): current
            restored += self._restore(store, partition)
            identity = self.stores[store].identity(partition)
            # Above every epoch its changelog holds, and published before any write: the next
            # owner's epoch is then above this one's, which fences our records.
            with self._sync_lock:
                held = self.local.hold(store, partition, identity=identity, epoch=epoch)
            epoch = max(epoch, held)
        with self.lock:
            if not self._map.view_is_current():
                raise ViewNotCurrent(
                    "this process stood still past the session timeout during the takeover: "
                    "the partitions may have been given to another member meanwhile; claimed "
                    "again once the cluster view is current (if this recurs, the process is "
                    "starved of CPU or the broker answers slowly: raise the session timeout)"
                )
            served = self.ownership.took_over(gained, epoch)
            for key in gained:
                self._failures.pop(key, None)
        self._publish()
        # Reads are served from the restored copies at once; the projection catches up after,
        # and commands wait (503) until the handler has replayed their partitions.
        self.sync()
        log.info(
            "serving %s after restoring %d changelog records in %.2fs",
            sorted(served),
            restored,
            time.monotonic() - started,
        )
