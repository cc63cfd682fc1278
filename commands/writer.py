"""The single writer of one partition of the events topic.

A :class:`PartitionWriter` holds a transactional producer whose ``transactional.id`` names the
partition. :meth:`~PartitionWriter.open` calls ``init_transactions``, which fences every other
producer holding that id: from then on the broker rejects their produce requests before any of
their records lands, so one writer at a time appends to the partition, whatever the consumers'
isolation level. Each command's events are appended in one transaction.

The writer also holds the aggregates of its partition (:class:`~.aggregates.PartitionAggregates`,
rebuilt by the handler's replay). Its methods block; the command handler calls them from worker
threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from foldstream.commands.aggregates import PartitionAggregates
from foldstream.domain import EventRecord
from foldstream.errors import BrokerUnavailable, NotOwner, PartitionFenced
from foldstream.kafka import producer_config

log = logging.getLogger(__name__)

# librdkafka reports fencing as _FENCED; the broker's own codes show up in delivery reports.
_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def _kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind ``exc``: the client sometimes wraps it in a SystemError."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KafkaException) and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


class PartitionWriter:
    """Appends to ``partition`` of ``topic`` with the transactional id ``transactional_id``;
    holds the partition's ``aggregates``."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        partition: int,
        transactional_id: str,
        linger_ms: int,
        timeout: float,
        aggregates: PartitionAggregates,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.transactional_id = transactional_id
        self.timeout = timeout
        self.aggregates = aggregates
        self._producer: Any = Producer(
            producer_config(
                bootstrap, linger_ms=linger_ms, **{"transactional.id": transactional_id}
            )
        )
        # Held for a whole transaction, so close() waits for an append in flight.
        self._mutex = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def open(self) -> None:
        """Fence every other producer of this transactional id (``init_transactions``)."""
        try:
            self._producer.init_transactions(self.timeout)
        except Exception as exc:
            raise BrokerUnavailable(
                f"cannot initialise transactions of {self.transactional_id!r}: {exc}"
            ) from exc

    def append(self, records: Sequence[EventRecord]) -> list[int]:
        """Append ``records`` in one transaction; return their offsets, in order.

        Raises :class:`PartitionFenced` when another writer took the id over (nothing of this
        transaction lands), :class:`BrokerUnavailable` when the transaction's outcome is unknown,
        and :class:`NotOwner` when the writer is already closed. After either failure the writer
        is closed: its aggregates may no longer match the partition.
        """
        delivered: list[tuple[Any, Any]] = []
        with self._mutex:
            if self._closed:
                raise NotOwner(self.partition, "was released by this instance")
            try:
                self._producer.begin_transaction()
                for record in records:
                    self._producer.produce(
                        self.topic,
                        key=record.key,
                        value=record.value,
                        headers=list(record.headers),
                        partition=self.partition,
                        on_delivery=lambda error, message: delivered.append((error, message)),
                    )
                self._producer.commit_transaction(self.timeout)
            except Exception as exc:
                self._fail()
                errors = [_kafka_error(exc), *(e for e, _ in delivered)]
                if any(e is not None and e.code() in _FENCED for e in errors):
                    raise PartitionFenced(self.partition) from exc
                raise BrokerUnavailable(
                    f"transaction on partition {self.partition} failed ({exc}); its outcome is "
                    "unknown and this instance released the partition. Resend the command with "
                    "the same Idempotency-Key (or expected_version) to apply it at most once"
                ) from exc
            landed = {(m.partition(), e) for e, m in delivered}
            if len(delivered) != len(records) or landed != {(self.partition, None)}:
                self._fail()
                raise BrokerUnavailable(
                    f"committed on partition {self.partition} but delivery reports say {landed}; "
                    "this instance released the partition"
                )
        # Delivery reports of one partition come in the order the records were produced.
        return [int(message.offset()) for _, message in delivered]

    def _fail(self) -> None:
        # close() would try to abort the failed transaction and warn; dropping the producer is
        # enough: a fenced or failed producer cannot append anything any more.
        self._closed = True
        self._producer = None

    def close(self) -> None:
        """Stop appending: wait for a transaction in flight, close the producer, then write
        the snapshots of the committed transactions not written yet."""
        with self._mutex:
            if self._closed:
                self.aggregates.close(write=False)
                return
            self._closed = True
            self.aggregates.close(write=True)
            producer, self._producer = self._producer, None
            try:
                producer.close()
            except Exception:  # e.g. a producer whose init_transactions failed; it is gone anyway
                log.warning(
                    "closing the producer of %s failed", self.transactional_id, exc_info=True
                )
