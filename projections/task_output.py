"""What a projection task sends to Kafka itself, and its wait for the acknowledgements: each
chunk's poison records to the store's dead-letter topic (:mod:`~foldstream.projections.poison`)
and its forwarded records to the repartition topics (:mod:`~foldstream.projections.emit`). A
chunk commits only once all of them are acknowledged (:mod:`~foldstream.projections.fold`);
its commit writes its changed values to the store's changelog, through the store host's hold
of the partition (:class:`~foldstream.state.held.HeldPartition`), then to the state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from foldstream.changelog.writer import MAX_RECORD_BYTES
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import producer_config
from foldstream.state import PartitionWriter
from foldstream.state.host import PartitionStop

_producers: dict[str, Producer] = {}
#: How long a task waits for its dead-letter and forwarded records' acknowledgements before it
#: fails.
ACK_TIMEOUT_S = 30
#: The largest key and value a store keeps: the rest of a changelog record (at most
#: :data:`~foldstream.changelog.writer.MAX_RECORD_BYTES`) is its headers and librdkafka's
#: accounting of them.
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
                # A re-keying rebuild forwards up to a record per record: room for whole
                # micro-batches. Records still queued when their task gives up must never land
                # later, after the retry's: they expire first (librdkafka then drops them).
                **{
                    "message.max.bytes": MAX_RECORD_BYTES,
                    "queue.buffering.max.messages": 1_000_000,
                    "batch.num.messages": 10_000,
                    "message.timeout.ms": ACK_TIMEOUT_S * 1000 * 2 // 3,
                },
            )
        )
        _producers[bootstrap] = producer
    return producer


@dataclass(eq=False)
class Folded:
    """One partition's records folded, its dead letters and forwarded records sent, and not
    yet committed: :func:`~foldstream.projections.fold.commit_folded` commits it (its changes
    to the changelog, then to the state) once they are all acknowledged."""

    writer: PartitionWriter
    applied: int = 0  # records the stored offset moves past: folded, dead-lettered or skipped
    last_offset: int | None = None  # None: nothing to commit
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


def await_acknowledgements(folded: Iterable[Folded]) -> None:
    """Wait until the dead-letter and forwarded records of ``folded`` are all acknowledged
    (one wait for all of them: their partitions' acknowledgements come back in the same round
    trips), or raise :class:`BrokerUnavailable`."""
    folded = list(folded)
    producers = {f.dead_letters for f in folded if f.dead_letters is not None}
    producers |= {f.forwarded for f in folded if f.forwarded is not None}
    unsent = sum(p.flush(ACK_TIMEOUT_S) for p in producers)
    errors = [e for f in folded for e in f.errors][:3]
    if unsent or errors:
        raise BrokerUnavailable(
            f"dead-letter or forwarded records not acknowledged ({unsent} records unsent): {errors}"
        )
