"""Store partitions copied from their changelog topics: restores and warm standby replicas.

Every changelog record carries the source offset its value reflects (header
:data:`SOURCE_OFFSET_HEADER`) and the one its writer folded from (:data:`FOLDED_FROM_HEADER`,
-1 for an empty store). Applying changelog records therefore moves a local copy's values,
its source offset and its changelog offset together, in one write batch: a copy that becomes
active resumes the projection from exactly the source offset its values reflect.

Every record also carries the epoch of its writer's hold on the partition
(:data:`EPOCH_HEADER`): a new owner writes with an epoch above every earlier owner's, so the
records of a previous owner that goes on writing after losing the partition (a long pause: a
"zombie") are recognised and ignored instead of mixing into the copies.

And the id of the source topic it was folded from (:data:`SOURCE_ID_HEADER`): copies never
apply the values of an earlier topic of the same name. A copy is checked against its topics
before it is used (:mod:`foldstream.stale_state`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from foldstream.backoff import Backoff
from foldstream.kafka import consume_available, consumer_config, read_partitions_to_end
from foldstream.settings import OnStaleState
from foldstream.stale_state import SOURCE_ID_HEADER, LocalCopy, open_checked
from foldstream.state import RocksDBWriter
from foldstream.state.base import Entries
from foldstream.state.format import TABLE_FORMAT

SOURCE_OFFSET_HEADER = "foldstream-source-offset"
FOLDED_FROM_HEADER = "foldstream-folded-from"
BATCH_START_HEADER = "foldstream-batch-start"
BATCH_END_HEADER = "foldstream-batch-end"
EPOCH_HEADER = "foldstream-epoch"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreLayout:
    """Where a store's state comes from: its source topic and its changelog topic; the format
    its partitions are kept in (:mod:`foldstream.state.format`: changelog records carry the
    keys as stored, so copying them needs no other knowledge of the store's kind); and what
    becomes of a local copy that does not belong to them (:mod:`foldstream.stale_state`)."""

    source_topic: str
    changelog_topic: str
    on_stale: OnStaleState = OnStaleState.rebuild
    table_format: str = TABLE_FORMAT
    #: False for the aggregate store: the command side writes it as it appends and replays
    #: past its position on takeover, so its distance from the topic's end (events of another
    #: writer) is nothing its owner has to catch up on.
    follows_source: bool = True

    def identity(self, partition: int) -> str:
        return f"{self.source_topic}/{partition}"

    def local_copy(self, state_dir: Path, store: str, partition: int) -> LocalCopy:
        return LocalCopy(
            Path(state_dir),
            store,
            partition,
            self.source_topic,
            self.changelog_topic,
            self.table_format,
        )


class ChangelogFollower:
    """Applies one partition's changelog records to a local copy, one whole batch at a time.

    A projection marks a batch's last record with :data:`BATCH_END_HEADER` (and its first
    with :data:`BATCH_START_HEADER`, which copies of earlier versions required). A batch is
    applied once closed: by its last record, or by the next batch when that one was folded from
    the source offset the batch reached. Compaction keeps only each key's newest record, so it
    removes many first and last records: a batch is applied whether or not its first record is
    there. Records of a batch cut short (its writer died or its task failed mid-batch) are
    dropped when the next batch starts, and so is the rest of the batch a copy stopped inside of
    (:meth:`settle` records which). A copy therefore never holds values ahead of the source
    offset it records. Records at or below the copy's changelog offset are skipped, so
    re-reading is harmless.

    Fencing: records of an epoch below the newest one seen (kept with the copy) are ignored,
    and a closed batch whose source offset the copy has already reached only moves its
    changelog offset: a previous owner's late writes can neither interrupt the current
    owner's batches nor take the copy's values back to an older source offset. Records folded
    from another source topic than the copy's (an earlier one of the same name, by their
    :data:`SOURCE_ID_HEADER`) are ignored too.
    """

    def __init__(self, writer: RocksDBWriter) -> None:
        self.writer = writer
        self._pending: list[Any] = []
        self._batch: bytes | None = None
        self._collecting = False  # collecting the current batch's records to apply it
        self._open = False  # the current batch has not been closed yet
        self._epoch = writer.changelog_epoch()
        # The batch the copy's position is inside of: its records before it were not applied.
        self._unfinished = writer.unfinished_batch()
        self._read: int | None = None  # the last changelog offset read
        self.fenced = 0  # records ignored as a previous owner's
        self.malformed = 0  # records ignored because their headers are not a projection's
        source_id = writer.topic_ids()[0]
        self._source_id = None if source_id is None else source_id.encode()
        self.foreign = 0  # records ignored as folded from an earlier source topic

    def feed(self, messages: Iterable[Any]) -> int:
        """Apply every closed batch in ``messages``; returns records applied."""
        applied = 0
        done = self.writer.changelog_offset()
        for message in messages:
            if done is not None and message.offset() <= done:
                continue
            self._read = message.offset()
            headers = dict(message.headers() or ())
            if self._foreign(headers.get(SOURCE_ID_HEADER)):
                self.foreign += 1
                continue
            epoch = _valid_headers(headers)
            if epoch is None:
                self.malformed += 1  # not written by a projection: nothing to apply
                continue
            if epoch < self._epoch:
                self.fenced += 1
                continue
            batch = headers.get(SOURCE_OFFSET_HEADER)
            if epoch > self._epoch or batch != self._batch:
                if self._closed_by(headers.get(FOLDED_FROM_HEADER)):
                    applied += self._apply(int(self._batch), self._pending[-1].offset())  # type: ignore[arg-type]
                self._pending.clear()
                self._epoch, self._batch = epoch, batch
                self._open = True
                # Whether or not compaction left its first record: a batch is read from its
                # start unless the copy stopped inside it.
                self._collecting = _batch_id(epoch, batch) != self._unfinished
            if not self._collecting:
                continue
            self._pending.append(message)
            if BATCH_END_HEADER in headers and batch is not None:
                applied += self._apply(int(batch), message.offset())
                self._collecting = self._open = False
        return applied

    def _foreign(self, source_id: bytes | None) -> bool:
        """Whether a record folded from the source topic ``source_id`` is of another topic
        than the copy's (unknown ids are no evidence)."""
        return None not in (source_id, self._source_id) and source_id != self._source_id

    def _closed_by(self, folded_from: bytes | None) -> bool:
        """Whether the unclosed batch being collected is complete, as shown by the next
        batch's writer having folded from its source offset or beyond: its closing record was
        compacted away. Folded from before it, the next batch shows it cut short (a failed
        task, a writer that died): that writer folds the same events again from there."""
        return (
            self._collecting
            and bool(self._pending)
            and folded_from is not None
            and self._batch is not None
            and int(folded_from) >= int(self._batch)
        )

    def settle(self) -> None:
        """Record what was read after the last applied batch as seen: the copy's changelog
        position moves past it and its epoch to the newest read.

        For a copy that stops following here (a takeover): the rest of an unclosed batch read
        is then dropped by whoever follows from this position, and the next writer's epoch,
        above the copy's, is above every epoch the changelog held.
        """
        done = self.writer.changelog_offset()
        if self._read is not None and (done is None or self._read > done):
            unfinished = _batch_id(self._epoch, self._batch) if self._open else None
            self.writer.note_changelog(self._read, self._epoch, unfinished)
        self._pending.clear()
        self._collecting = False

    def _apply(self, source_offset: int, changelog_offset: int) -> int:
        reached = self.writer.applied_offset()
        applied = 0  # a stale batch (values older than the copy's) only moves the position
        if reached is None or source_offset > reached:
            for record in self._pending:
                if record.value() is None:
                    self.writer.delete(record.key())
                else:
                    self.writer.put(record.key(), record.value())
            reached, applied = source_offset, len(self._pending)
        self.writer.commit(reached, changelog_offset=changelog_offset, changelog_epoch=self._epoch)
        self._pending.clear()
        return applied


_DECIMAL = re.compile(rb"-?[0-9]{1,19}")


def _valid_headers(headers: Mapping[str, bytes | None]) -> int | None:
    """The epoch of a changelog record whose foldstream headers are well formed (decimal
    numbers where numbers go), else None: anything can be written to a topic."""
    numbers = [
        headers.get(name) for name in (EPOCH_HEADER, SOURCE_OFFSET_HEADER, FOLDED_FROM_HEADER)
    ]
    if any(n is not None and not _DECIMAL.fullmatch(n) for n in numbers):
        return None
    return int(numbers[0] or 0)


def _batch_id(epoch: int, batch: bytes | None) -> bytes:
    return b"%d:%s" % (epoch, batch or b"")


def open_copy(state_dir: Path, store: str, layout: StoreLayout, partition: int) -> RocksDBWriter:
    """Open the local copy of ``store``'s ``partition`` for writing (creating it), unchecked."""
    return layout.local_copy(state_dir, store, partition).open()


def restore(
    *,
    bootstrap: str,
    state_dir: Path,
    store: str,
    layout: StoreLayout,
    partition: int,
    fetch_wait_max_ms: int = 10,
) -> int:
    """Bring the local copy of a partition up to the end of its changelog; returns records read.

    Reads only what the copy lacks (from its changelog offset on). A copy whose directory was
    lost is rebuilt from offset 0 (a compacted changelog holds the latest value of every key).
    A copy that does not belong to its topics (recreated since it was made) is first rebuilt
    or refused, by ``layout.on_stale`` (:func:`foldstream.stale_state.open_checked`).
    """
    copy = layout.local_copy(state_dir, store, partition)
    writer = open_checked(bootstrap, copy, layout.on_stale)
    try:
        start = writer.changelog_offset()
        follower = ChangelogFollower(writer)
        applied = 0
        for batch in read_partitions_to_end(
            bootstrap,
            layout.changelog_topic,
            {partition: 0 if start is None else start + 1},
            fetch_wait_max_ms=fetch_wait_max_ms,
        ):
            applied += follower.feed(batch)
        follower.settle()
        if follower.foreign:
            log.info("%s: ignored %d records of an older source topic", copy.path, follower.foreign)
        return applied
    finally:
        writer.close()


@dataclass
class _Replica:
    follower: ChangelogFollower
    position: int  # next changelog offset to read
    end: int | None = None  # changelog end as of the last fetch
    copied: int = 0  # records applied before the copy first caught up; -1 once it has
    backoff: Backoff = field(default_factory=Backoff)  # after a failure to apply its records

    @property
    def writer(self) -> RocksDBWriter:
        return self.follower.writer


class StandbyReplicas:
    """Warm copies of store partitions this instance may take over, kept in one thread.

    ``layouts`` maps each store to its topics. :meth:`assign` sets which ``(store, partition)``
    copies to keep; :meth:`release` hands copies back (closed, flushed) before a takeover.
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
        self.layouts = dict(layouts)
        self._by_topic = {layout.changelog_topic: store for store, layout in self.layouts.items()}
        self._replicas: dict[tuple[str, int], _Replica] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._on_error = on_error
        self._waiting = False  # a copy waits to retry after a failure
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
            self._reassign()

    def _reassign(self) -> None:
        """Fetch each copy's changelog from its position, except copies waiting to retry."""
        now = time.monotonic()
        self._consumer.assign(
            [
                TopicPartition(self.layouts[s].changelog_topic, p, r.position)
                for (s, p), r in sorted(self._replicas.items())
                if r.backoff.due(now)
            ]
        )
        self._waiting = any(not r.backoff.due(now) for r in self._replicas.values())

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
        """Changelog records not yet applied (None until the end is known or if not held)."""
        with self._lock:
            replica = self._replicas.get((store, partition))
            if replica is None or replica.end is None:
                return None
            return max(0, replica.end - replica.position)

    def _close(self, key: tuple[str, int]) -> None:
        self._replicas.pop(key).writer.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            messages: list[Any] = []
            try:
                with self._lock:
                    if self._waiting:
                        self._reassign()  # copies whose retry is due fetch again
                    if self._replicas:
                        messages = consume_available(self._consumer, 5_000, 0)
                        self._apply(messages)
            except Exception:  # noqa: BLE001 - the fetch itself failed: try again
                log.exception("standby replication could not fetch; retrying")
                self._stopping.wait(1.0)
                continue
            if not messages:
                self._stopping.wait(0.01)

    def _apply(self, messages: list[Any]) -> None:
        by_key: dict[tuple[str, int], list[Any]] = {}
        at_end: list[tuple[tuple[str, int], int]] = []
        outside: set[tuple[str, int]] = set()
        for message in messages:
            store = self._by_topic.get(message.topic())
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
        failed = False
        for key, batch in by_key.items():
            replica = self._replicas[key]
            try:
                self._feed(key, replica, batch)
            except Exception as exc:  # noqa: BLE001 - retried from the copy's own position
                failed = True
                self._failed(key, replica, exc)
        if failed:
            self._reassign()
        # End-of-partition events are handled after the records fetched with them, which may
        # precede them in the same poll: "caught up" counts every record copied before it.
        for key, end in at_end:
            replica = self._replicas[key]
            replica.end = max(end, replica.position)
            if replica.copied >= 0:
                log.info(
                    "standby copy %s/%d caught up after copying %d changelog records",
                    *key,
                    replica.copied,
                )
                replica.copied = -1
        if outside:  # its changelog was created again: checked again when taken up again
            log.warning("standby copies %s are past their changelog's end: dropped", outside)
            self.assign(set(self._replicas) - outside)

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
        high = self._consumer.get_watermark_offsets(
            TopicPartition(self.layouts[key[0]].changelog_topic, key[1]), cached=True
        )
        # The high watermark that comes with fetched data is exact (unlike ListOffsets).
        if high and high[1] >= 0:
            replica.end = max(high[1], replica.position)

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
