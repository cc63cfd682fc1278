"""What a projection task sends to Kafka, and its wait for the acknowledgements: each chunk's
changed values to the store's compacted changelog, its poison records to the store's
dead-letter topic (:mod:`~foldstream.projections.poison`). A chunk commits only once all of
them are acknowledged (:mod:`~foldstream.projections.fold`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import Producer

from foldstream.changelog_batches import batch_headers, send_batch
from foldstream.changelog_batches import changelog_position as changelog_position  # re-exported
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import producer_config
from foldstream.state import PartitionWriter
from foldstream.state.host import PartitionStop

_producers: dict[str, Producer] = {}
#: How long a task waits for its changelog records' acknowledgements before it fails.
CHANGELOG_ACK_TIMEOUT_S = 30
#: The largest record the task's producer sends (librdkafka's default, and about the Kafka
#: brokers' default), and the largest key and value a store keeps: the rest of a changelog
#: record is its headers and librdkafka's accounting of them.
MAX_RECORD_BYTES = 1_000_000
MAX_VALUE_BYTES = MAX_RECORD_BYTES - 4096
#: How long the task's producer holds records to batch them. A task flushes before it commits,
#: and a flush sends at once whatever linger holds, so a long linger delays no commit; it only
#: makes fewer, larger produce requests while a large chunk folds. A broker's cost is largely
#: per request (docs/benchmarks.md, "The re-key figure: requests to the broker").
TASK_LINGER_MS = 50


def task_producer(bootstrap: str) -> Producer:
    # One idempotent producer per reused Python worker.
    producer = _producers.get(bootstrap)
    if producer is None:
        producer = Producer(
            producer_config(
                bootstrap,
                linger_ms=TASK_LINGER_MS,
                # A rebuild sends up to a key per record: room for whole micro-batches.
                # Records still queued when their task gives up must never land later, after
                # the retry's: they expire first (librdkafka then drops them for good).
                **{
                    "message.max.bytes": MAX_RECORD_BYTES,
                    "queue.buffering.max.messages": 1_000_000,
                    "batch.num.messages": 10_000,
                    "message.timeout.ms": CHANGELOG_ACK_TIMEOUT_S * 1000 * 2 // 3,
                },
            )
        )
        _producers[bootstrap] = producer
    return producer


class ChangelogTarget(NamedTuple):
    """Where a partition's changed values go: its changelog ``partition`` of ``topic``, each
    record stamped with ``epoch``, the epoch of the instance's hold of the partition, and with
    ``source_id``, the id of the source topic folded (None: the broker has no topic ids)."""

    producer: Producer
    topic: str
    partition: int
    epoch: int
    source_id: str | None = None


@dataclass(eq=False)
class Folded:
    """One partition's records folded, its changed values sent to the changelog (and its
    dead letters to the dead-letter topic) and not yet committed: :func:`commit_folded`
    commits it once they are all acknowledged."""

    writer: PartitionWriter
    changelog: ChangelogTarget | None
    applied: int = 0  # records the stored offset moves past: folded, dead-lettered or skipped
    last_offset: int | None = None  # None: nothing to commit
    landed: list[int] = field(default_factory=list)  # changelog offsets, from delivery reports
    errors: list[str] = field(default_factory=list)
    #: Poison records by outcome (:mod:`~foldstream.projections.poison`).
    outcomes: Counter[str] = field(default_factory=Counter)
    dead_letters: Any = None  # the producer of its dead-letter records, if it sent any
    forwarded: Any = None  # the producer of its forwarded records, if it sent any
    stop: PartitionStop | None = None  # where the partition stopped (policy ``stop``)
    late: int = 0  # records a windowed store dropped as late

    def on_delivery(self, error: Any, message: Any) -> None:
        """Delivery report of a dead-letter or a forwarded record."""
        if error is not None:
            self.errors.append(str(error))


def send_changes(
    folded: Folded,
    changelog: ChangelogTarget,
    changed: dict[bytes, bytes | None],
    applied_offset: int | None,
) -> None:
    """Queue ``changed`` for the changelog as one batch (:mod:`foldstream.changelog_batches`),
    stamped with the source offset the chunk reaches and the one it was folded from."""
    producer, topic, partition, epoch, source_id = changelog
    assert folded.last_offset is not None
    headers = batch_headers(folded.last_offset, applied_offset, epoch, source_id)

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            folded.errors.append(str(error))
        else:
            folded.landed.append(message.offset())

    send_batch(producer, topic, partition, changed, headers, on_delivery)


def await_changelog(folded: Iterable[Folded]) -> None:
    """Wait until the changelog, dead-letter and forwarded records of ``folded`` are all
    acknowledged (one wait for all of them: their partitions' acknowledgements come back in the
    same round trips), or raise :class:`BrokerUnavailable`."""
    folded = list(folded)
    producers = {f.changelog.producer for f in folded if f.changelog is not None}
    producers |= {f.dead_letters for f in folded if f.dead_letters is not None}
    producers |= {f.forwarded for f in folded if f.forwarded is not None}
    unsent = sum(p.flush(CHANGELOG_ACK_TIMEOUT_S) for p in producers)
    failed = [f for f in folded if f.errors]
    if unsent or failed:
        where = ", ".join(
            f"{f.changelog.topic}/{f.changelog.partition}" if f.changelog else "dead letters"
            for f in failed
        )
        errors = [e for f in failed for e in f.errors][:3]
        raise BrokerUnavailable(
            f"changelog not acknowledged ({unsent} records unsent; {where or 'none'} failed): "
            f"{errors}"
        )
