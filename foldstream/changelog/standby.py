"""Warm standby copies of store partitions, kept up to date from their changelogs in one
thread, ready for a takeover."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from foldstream.backoff import Backoff
from foldstream.changelog.follower import ChangelogFollower
from foldstream.changelog.layout import StoreLayout
from foldstream.kafka import consumer_config
from foldstream.stale_state import open_checked
from foldstream.state import RocksDBWriter
from foldstream.state.base import Entries

log = logging.getLogger(__name__)

#: How long the copying thread waits for the next changelog record before it looks again at
#: copies waiting to retry (and at a stop).
POLL_WAIT_S = 0.1
#: The most changelog records taken at once (the first polled, the rest already fetched).
MAX_RECORDS = 5_000


@dataclass
class _Replica:
    follower: ChangelogFollower
    position: int  # next changelog offset to read
    end: int | None = None  # changelog end as of the last fetch
    copied: int = 0  # records applied before the copy first caught up; -1 once it has
    backoff: Backoff = field(default_factory=Backoff)  # after a failure to apply its records
    idle_span: tuple[int, int | None] | None = None  # (position, end) when last found idle
    fetched_again: tuple[int, int | None] | None = None  # the idle span last fetched again

    @property
    def writer(self) -> RocksDBWriter:
        return self.follower.writer


class StandbyReplicas:
    """Warm copies of store partitions this instance may take over, kept in one thread.

    ``layouts`` maps each store to its topics (read as it is at each use: a
    :class:`~foldstream.changelog.StoreCatalog` may gain stores). :meth:`assign` sets which
    ``(store, partition)`` copies to keep; :meth:`release` hands copies back (closed, flushed)
    before a takeover.
    ``on_applied(store, partition, offset)`` is called after each batch a copy applied, with the
    source offset it reached.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        state_dir: Path,
        layouts: Mapping[str, StoreLayout],
        fetch_wait_max_ms: int = 10,
        on_error: Callable[[BaseException], None] | None = None,
        on_applied: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self._on_applied = on_applied
        self.state_dir = Path(state_dir)
        # Not copied: a catalog (:class:`~foldstream.changelog.StoreCatalog`) gains stores.
        self.layouts = layouts
        self._replicas: dict[tuple[str, int], _Replica] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._on_error = on_error
        self._waiting = False  # a copy waits to retry after a failure
        # Assignments made: a record polled across one is fetched again from its copy's position.
        self._assigned = 0
        self._refetch = False  # the consumer's assignment must be made again before a poll
        self._ends_noted_at = 0.0  # when _note_ends last ran
        config = consumer_config(bootstrap, fetch_wait_max_ms=fetch_wait_max_ms)
        # A position outside a changelog (created again) is reported, not reset to its start
        # (compaction keeps a changelog's first offset at 0).
        config["auto.offset.reset"] = "error"
        self._consumer = Consumer(config)
        self._thread = threading.Thread(target=self._run, name="standby-replicas", daemon=True)
        self._thread.start()

    def assign(self, wanted: Iterable[tuple[str, int]]) -> None:
        """Keep exactly the copies in ``wanted`` (``(store, partition)`` pairs). A copy taken
        up that does not belong to its topics is rebuilt or refused first (by its layout's
        ``on_stale``, see :func:`foldstream.stale_state.open_checked`)."""
        wanted = set(wanted)
        with self._lock:
            try:
                for key in set(self._replicas) - wanted:
                    self._close(key)
                for key in wanted - set(self._replicas):
                    store, partition = key
                    layout = self.layouts[store]
                    copy = layout.local_copy(self.state_dir, store, partition)
                    writer = open_checked(self.bootstrap, copy, layout.on_stale)
                    done = writer.changelog_offset()
                    self._replicas[key] = _Replica(
                        ChangelogFollower(writer), 0 if done is None else done + 1
                    )
            finally:  # a copy refused (raised) leaves the others opened so far fetched
                self._reassign()

    def _reassign(self) -> None:
        """Fetch each copy's changelog from its position, except copies waiting to retry."""
        now = time.monotonic()
        self._assigned += 1
        self._refetch = True  # until the assignment below is made
        self._consumer.assign(
            [
                TopicPartition(self.layouts[s].changelog_topic, p, r.position)
                for (s, p), r in sorted(self._replicas.items())
                if r.backoff.due(now)
            ]
        )
        self._waiting = any(not r.backoff.due(now) for r in self._replicas.values())
        self._refetch = False

    def release(self, keys: Iterable[tuple[str, int]]) -> None:
        """Stop keeping ``keys`` and close their copies, so another writer may open them."""
        with self._lock:
            released = [k for k in keys if k in self._replicas]
            if released:
                self.assign(set(self._replicas) - set(released))

    def held(self) -> frozenset[tuple[str, int]]:
        with self._lock:
            return frozenset(self._replicas)

    def get(self, store: str, partition: int, key: bytes) -> bytes | None:
        """Read ``key`` from the copy of ``(store, partition)``; KeyError if not held."""
        with self._lock:
            return self._replicas[(store, partition)].writer.get(key)

    def applied_offset(self, store: str, partition: int) -> int | None:
        """The source offset the copy of ``(store, partition)`` reflects (None: none yet);
        KeyError if not held."""
        with self._lock:
            return self._replicas[(store, partition)].writer.applied_offset()

    def scan(self, store: str, partition: int, start: bytes, end: bytes, limit: int) -> Entries:
        """Entries of ``[start, end)`` of the copy of ``(store, partition)``; KeyError if not
        held."""
        with self._lock:
            return self._replicas[(store, partition)].writer.scan(start, end, limit)

    def lag(self, store: str, partition: int) -> int | None:
        """Changelog records not yet applied (None until the end is known or if not held).

        The end is the changelog's high watermark as the copy's consumer last heard it, which
        every fetch answer carries, records or not (:meth:`_note_end`, at least every
        :data:`POLL_WAIT_S`): a copy that cannot read on (its records stop at a transaction
        left open) still sees the owner's records land past it, and counts them. The end its
        own reads reach is no measure: a consumer of committed records only stops at the last
        stable offset, and would call itself caught up there however far the owner had written
        (a standby then answered reads with ``max_lag=0`` with a value the owner had replaced).
        """
        with self._lock:
            replica = self._replicas.get((store, partition))
            if replica is None or replica.end is None:
                return None
            return max(0, replica.end - replica.position)

    def _note_end(self, key: tuple[str, int], replica: _Replica, *, idle: bool = False) -> None:
        """Take the changelog partition's high watermark from the consumer's last fetch answer
        (no request: exact, unlike ListOffsets) as the copy's end.

        ``idle``: every record the consumer gave was applied, so its position (past the last
        record given, and past the markers and aborted records it skipped since) is the copy's.
        On a replicated changelog the end-of-partition event can come before the high watermark
        covers a transaction's marker (not replicated yet); the fetch that later skips the
        marker raises no event, and the copy's lag stayed 1 for good."""
        changelog = TopicPartition(self.layouts[key[0]].changelog_topic, key[1])
        try:
            found = self._consumer.get_watermark_offsets(changelog, cached=True)
            if idle and replica.end is not None and replica.end > replica.position:
                self._past_markers(changelog, replica)
        except KafkaException:  # not fetched
            return
        if found and found[1] >= 0:
            replica.end = max(found[1], replica.position)

    def _past_markers(self, changelog: TopicPartition, replica: _Replica) -> None:
        """Move an idle copy behind its end to its consumer's position; if that does not
        reach the end and the span stays as it was, fetch the span again once: the fetch ends
        in an end-of-partition event at the end if only markers lie there."""
        (read,) = self._consumer.position([changelog])
        if read.error is None and read.offset > replica.position:
            replica.position = read.offset
            return
        span = (replica.position, replica.end)
        if replica.idle_span == span and replica.fetched_again != span:
            changelog.offset = replica.position
            self._consumer.seek(changelog)
            replica.fetched_again = span
        replica.idle_span = span

    def _note_ends(self, *, idle: bool = False) -> None:
        """:meth:`_note_end` of every copy fetched since it was taken up, every
        :data:`POLL_WAIT_S` at most (5 us each), whether or not records came (``idle``: none
        came, and none is held unapplied)."""
        now = time.monotonic()
        if now - self._ends_noted_at < POLL_WAIT_S:
            return
        self._ends_noted_at = now
        for key, replica in self._replicas.items():
            if replica.end is not None:
                self._note_end(key, replica, idle=idle)

    def _close(self, key: tuple[str, int]) -> None:
        self._replicas.pop(key).writer.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._copy_next()
            except Exception:  # noqa: BLE001 - the fetch itself failed: try again
                log.exception("standby replication could not fetch; retrying")
                self._refetch = True  # the consumer may have moved past unapplied records
                self._stopping.wait(1.0)

    def _copy_next(self) -> None:
        """Wait up to :data:`POLL_WAIT_S` for the next changelog record, then apply it and
        what came with it. The wait is outside the lock, and without the GIL: readers of the
        copies go on meanwhile, and an idle instance does not wake this thread every few
        milliseconds, which cost the query thread CPU (docs/benchmarks.md, "Batch lookups:
        one get per key")."""
        with self._lock:
            if self._waiting or self._refetch:
                self._reassign()  # copies whose retry is due (or all, after a failure) fetch again
            held, assigned = bool(self._replicas), self._assigned
        if not held:
            self._stopping.wait(POLL_WAIT_S)
            return
        first = self._consumer.poll(POLL_WAIT_S)
        with self._lock:
            # A copy given no records may still be behind; with none given, none is unapplied.
            self._note_ends(idle=first is None and not self._refetch)
            if first is None:
                return
            if self._assigned != assigned:
                # Reassigned meanwhile: the record may come from either assignment, and the
                # new one has moved past it if it is its first. Nothing was applied since the
                # poll: fetching again from each copy's position skips nothing.
                self._reassign()
                return
            self._apply([first, *self._consumer.consume(MAX_RECORDS - 1, 0)])

    def _apply(self, messages: list[Any]) -> None:
        by_key: dict[tuple[str, int], list[Any]] = {}
        at_end: list[tuple[tuple[str, int], int]] = []
        outside: set[tuple[str, int]] = set()
        by_topic = {layout.changelog_topic: store for store, layout in self.layouts.items()}
        for message in messages:
            store = by_topic.get(message.topic())
            key = (store, message.partition()) if store is not None else None
            if key is None or key not in self._replicas:
                continue  # a record fetched just before its partition was released
            error = message.error()
            if error is None:
                by_key.setdefault(key, []).append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.append((key, message.offset()))
            elif error.code() == KafkaError._AUTO_OFFSET_RESET:
                outside.add(key)
            else:  # the client retries by itself; the event carries no record
                log.warning("standby copy %s/%d: %s", *key, error)
        failed: set[tuple[str, int]] = set()
        for key, batch in by_key.items():
            replica = self._replicas[key]
            try:
                self._feed(key, replica, batch)
            except Exception as exc:  # noqa: BLE001 - retried from the copy's own position
                failed.add(key)
                self._failed(key, replica, exc)
        if failed:
            self._reassign()
        # End-of-partition events are handled after the records fetched with them, which may
        # precede them in the same poll: "caught up" counts every record copied before it.
        for key, end in at_end:
            if key not in failed:  # else read again from its own position
                self._reached_end(key, self._replicas[key], end)
        if outside:  # its changelog was created again: checked again when taken up again
            log.warning("standby copies %s are past their changelog's end: dropped", outside)
            self.assign(set(self._replicas) - outside)

    def _reached_end(self, key: tuple[str, int], replica: _Replica, end: int) -> None:
        """The copy's consumer read to ``end``: every offset before it was a record given
        (and fed above) or none to give, a transaction's marker or an aborted record, which
        the copy's position passes too (else its lag would count a marker forever). ``end``
        is the last stable offset when a transaction is open, not the end lag() counts to."""
        replica.position = max(replica.position, end)
        replica.end = replica.position
        self._note_end(key, replica)
        if replica.copied >= 0:
            log.info(
                "standby copy %s/%d caught up after copying %d changelog records",
                *key,
                replica.copied,
            )
            replica.copied = -1

    def _feed(self, key: tuple[str, int], replica: _Replica, batch: list[Any]) -> None:
        follower = replica.follower
        fenced, malformed = follower.fenced, follower.malformed
        applied = follower.feed(batch)
        if follower.fenced > fenced:
            log.warning(
                "standby copy %s/%d ignored %d changelog records of an older epoch (a "
                "previous owner writing late); it follows the newest owner",
                *key,
                follower.fenced - fenced,
            )
        if follower.malformed > malformed:
            log.warning(
                "standby copy %s/%d ignored %d records whose headers are not a projection's",
                *key,
                follower.malformed - malformed,
            )
        if replica.copied >= 0:
            replica.copied += applied
        if applied and self._on_applied is not None:
            reached = replica.writer.applied_offset()
            if reached is not None:
                self._on_applied(key[0], key[1], reached)
        replica.position = batch[-1].offset() + 1
        replica.backoff.reset()
        self._note_end(key, replica)

    def _failed(self, key: tuple[str, int], replica: _Replica, error: Exception) -> None:
        """Applying ``replica``'s records failed: it forgets what it collected and reads again
        from the position its state records, after a backoff; no record is skipped."""
        writer = replica.writer
        replica.follower = ChangelogFollower(writer)
        done = writer.changelog_offset()
        replica.position = 0 if done is None else done + 1
        delay = replica.backoff.failed(time.monotonic())
        log.error(
            "standby copy %s/%d could not apply changelog records (%s: %s); reading again from "
            "offset %d in %.1fs",
            *key,
            type(error).__name__,
            error,
            replica.position,
            delay,
        )
        if self._on_error is not None:
            self._on_error(error)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        with self._lock:
            for key in list(self._replicas):
                self._close(key)
        self._consumer.close()
