"""Restores from a changelog the broker's log cleaner really compacted (a Kafka node whose
cleaner looks for work every 100 ms, the changelog rolling a segment every 100 ms).

A paused former owner's late changelog write, then compaction, then a restore: the restored
copy must equal the fold of the events, with the real task code folding through real store
hosts. The pause is made deterministic: the former owner's store host stops answering (as when
its process stands still) while its task waits for the partition's values, the new owner takes
the partition over and writes the same key, and only then does the old host answer again.

A copy that resumes from its position after a deletion's tombstone was compacted away would
keep the key: it is rebuilt from the whole changelog instead.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foldstream.broker import KafkaCluster
from foldstream.changelog import EPOCH_HEADER, ChangelogWriter, StoreLayout, open_copy, restore
from foldstream.domain import EventCodec, EventRecord
from foldstream.examples.inventory.domain import Product
from foldstream.kafka import TopicSpec, ensure_topics, read_to_end
from foldstream.projections import fold_task
from foldstream.projections.query_groups import stores_option
from foldstream.state.host import StoreHost

STORE = "stock"
#: Topic settings that let the log cleaner compact within a second: segments roll every 100 ms
#: (on the next append), any dirty share is worth cleaning, records and tombstones may go at once.
FAST_COMPACTION = {
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}
#: The broker's cleaner looks for dirty logs every 100 ms (Kafka's default: 15 s).
CLEANER = {"log.cleaner.backoff.ms": "100"}
COMPACTED_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def cleaning_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(data_dir=tmp_path_factory.mktemp("kafka"), properties=CLEANER) as running:
        yield running


class Events:
    """Inventory events of one source partition, at offsets from 0, and their plain fold."""

    def __init__(self) -> None:
        self.records: list[tuple[int, EventRecord]] = []
        self.on_hand: Counter[str] = Counter()
        self._products: dict[str, Product] = {}
        self._codec = EventCodec()

    def ship(self, product_id: str, quantity: int) -> None:
        product = self._products.get(product_id)
        if product is None:
            product = self._products[product_id] = Product(id=product_id)
        product.receive_shipment(quantity)
        for event in product.collect_events():
            self.records.append((len(self.records), self._codec.encode(event)))
        self.on_hand[product_id] += quantity


class Owner:
    """One instance's side of the partition: its store host and its tasks."""

    def __init__(self, broker: KafkaCluster, state_dir: Path, layout: StoreLayout) -> None:
        self.broker, self.state_dir, self.layout = broker, state_dir, layout
        self.host = StoreHost(state_dir=state_dir)
        self.host.start()

    def take_over(self, epoch: int) -> None:
        """Fence the changelog's earlier writers, restore the partition's copy from the
        changelog and hold it, writing through the new writer, as a takeover does."""
        changelog = ChangelogWriter.fenced(
            bootstrap=self.broker.bootstrap, topic=self.layout.changelog_topic, partition=0
        )
        restore(
            bootstrap=self.broker.bootstrap,
            state_dir=self.state_dir,
            store=STORE,
            layout=self.layout,
            partition=0,
        )
        self.host.open(STORE, 0, identity=self.layout.identity(0), epoch=epoch, changelog=changelog)

    def fold(self, records: list[tuple[int, EventRecord]]) -> None:
        """One task folding ``records`` of partition 0 (skipped if the partition moved)."""
        options = {
            "stores": stores_option(
                [{"store": STORE, "changelog_topic": self.layout.changelog_topic}]
            ),
            "service": "foldstream.examples.inventory:service",
            "store_host": self.host.address,
            "store_token": self.host.authkey.hex(),
            "bootstrap": self.broker.bootstrap,
        }
        fold_task.fold_task(options, iter([{0: records}]), dict)

    def stand_still(self) -> tuple[threading.Event, threading.Event]:
        """Make the held partition stop answering its tasks' reads (the instance's process
        stands still); returns an event set once a task waits for it, and the event that lets
        it answer again."""
        held = self.host.partition(STORE, 0)
        assert held is not None
        waiting, resume = threading.Event(), threading.Event()
        read = held.read

        def read_after_resume(keys: list[bytes]) -> Any:
            waiting.set()
            resume.wait()
            return read(keys)

        held.read = read_after_resume  # type: ignore[method-assign]
        return waiting, resume

    def close(self) -> None:
        self.host.stop()


def changelog_records(broker: KafkaCluster, topic: str) -> list[tuple[bytes, int]]:
    """``(key, writer epoch)`` of every record of partition 0, as a copy reads them."""
    return [
        (message.key(), int(dict(message.headers())[EPOCH_HEADER]))
        for batch in read_to_end(broker.bootstrap, topic, 1)
        for message in batch
    ]


def wait_compacted(broker: KafkaCluster, topic: str, key: bytes) -> list[tuple[bytes, int]]:
    """The changelog once the cleaner has compacted away all but one record of ``key``."""
    deadline = time.monotonic() + COMPACTED_WITHIN_S
    while True:
        records = changelog_records(broker, topic)
        if sum(k == key for k, _ in records) == 1:
            return records
        assert time.monotonic() < deadline, f"{topic} not compacted: {records}"
        time.sleep(0.5)


def restored_values(broker: KafkaCluster, state_dir: Path, layout: StoreLayout) -> dict[str, int]:
    restore(
        bootstrap=broker.bootstrap, state_dir=state_dir, store=STORE, layout=layout, partition=0
    )
    copy = open_copy(state_dir, STORE, layout, 0)
    try:
        values = {}
        for product_id in ("contested", "other", "fresh", "later"):
            raw = copy.get(product_id.encode())
            if raw is not None:
                values[product_id] = json.loads(raw)["on_hand"]
        return values
    finally:
        copy.close()


def test_a_paused_owners_late_write_leaves_no_key_missing_after_compaction(
    cleaning_broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = StoreLayout("paused.events", "paused.stock.changelog")
    ensure_topics(
        cleaning_broker.bootstrap,
        [TopicSpec(layout.changelog_topic, 1, compact=True, config=FAST_COMPACTION)],
    )
    events = Events()
    for quantity in (1, 2):
        events.ship("contested", quantity)
        events.ship("other", quantity)
    old = Owner(cleaning_broker, tmp_path / "old", layout)
    new = Owner(cleaning_broker, tmp_path / "new", layout)
    try:
        old.take_over(epoch=1)
        old.fold(events.records)
        first = len(events.records)
        events.ship("contested", 4)
        events.ship("other", 8)
        planned = events.records[first:]
        # The old owner's next task waits for its store host, which stands still ...
        waiting, resume = old.stand_still()
        late = threading.Thread(target=old.fold, args=(planned,))
        late.start()
        assert waiting.wait(30), "the old owner's task never asked its store host"
        # ... while the new owner takes the partition over and folds the same events, and one
        # more: its record of "fresh" is the one compaction keeps of its batch.
        events.ship("fresh", 32)
        new.take_over(epoch=2)
        new.fold(events.records[first:])
        resume.set()  # the old owner's task goes on: it writes late, if anything lets it
        late.join(60)
        assert not late.is_alive()
        held = old.host.partition(STORE, 0)
        assert held is not None and held.applied_offset() == first - 1  # it took nothing late
        # A later segment (segments roll on the first append after 100 ms) lets the cleaner
        # compact the one holding both owners' records of "contested".
        time.sleep(0.2)
        before = len(events.records)
        events.ship("later", 16)
        new.fold(events.records[before:])
    finally:
        old.close()
        new.close()
    compacted = wait_compacted(cleaning_broker, layout.changelog_topic, b"contested")
    # At least 6 records were written (2 by the first batch, 3 by the new owner's, 1 for
    # "later"): one of each key is left.
    assert sorted(key for key, _ in compacted) == [b"contested", b"fresh", b"later", b"other"]
    assert restored_values(cleaning_broker, tmp_path / "restored", layout) == dict(events.on_hand)


def test_a_copy_too_old_for_the_deletions_since_is_rebuilt_not_resumed(
    cleaning_broker: KafkaCluster, tmp_path: Path
) -> None:
    """The copy read "a" and "b"; then "a" is deleted and its tombstone compacted away (kept
    100 ms: the copy's position is older than half of that). Resumed from its position, the
    copy would read nothing about "a" and keep it: it is rebuilt from the changelog."""
    layout = StoreLayout("stale.events", "stale.s.changelog")
    config = {**FAST_COMPACTION, "delete.retention.ms": "100"}
    ensure_topics(
        cleaning_broker.bootstrap,
        [TopicSpec(layout.changelog_topic, 1, compact=True, config=config)],
    )
    writer = ChangelogWriter.fenced(
        bootstrap=cleaning_broker.bootstrap, topic=layout.changelog_topic, partition=0
    )
    source = iter(range(1, 1000))

    def write(changes: dict[bytes, bytes | None]) -> None:
        offset = next(source)
        writer.write(
            changes, source_offset=offset, folded_from=offset - 1, epoch=1, source_id=None,
            position=None,
        )  # fmt: skip

    try:
        write({b"a": b"a@1", b"b": b"b@1"})
        copy = tmp_path / "copy"
        restore(
            bootstrap=cleaning_broker.bootstrap, state_dir=copy, store="s", layout=layout,
            partition=0,
        )  # fmt: skip
        write({b"a": None})
        deadline = time.monotonic() + COMPACTED_WITHIN_S
        while b"a" in {
            key for key, _ in changelog_records(cleaning_broker, layout.changelog_topic)
        }:
            assert time.monotonic() < deadline, "the tombstone of a was never compacted away"
            time.sleep(0.3)  # later than a segment's 100 ms and the tombstone's 100 ms
            write({b"c": b"c@%d" % time.monotonic_ns()})  # segments roll, the cleaner works
    finally:
        writer.close()
    restore(
        bootstrap=cleaning_broker.bootstrap, state_dir=copy, store="s", layout=layout,
        partition=0,
    )  # fmt: skip
    reader = open_copy(copy, "s", layout, 0)
    try:
        assert (reader.get(b"a"), reader.get(b"b")) == (None, b"b@1")
    finally:
        reader.close()
