"""The one writer of a store partition's changelog partition, fenced at the broker.

A :class:`ChangelogWriter` is a transactional producer whose ``transactional.id`` names the
changelog partition (``<changelog topic>.<partition>``). An instance taking the partition over
makes one and fences (``init_transactions``) before it restores its copy: from then on the
broker refuses the previous owner's changelog writes, and a transaction of theirs still open
is aborted (hidden from the copies, which read ``read_committed``, and dropped by the log
cleaner). The store host's hold of the partition writes through it
(:class:`~foldstream.state.held.HeldPartition`): each chunk's changes in one transaction,
committed before the state takes them.

Fencing lives with the hold, in the instance's process, not in the Spark tasks: Spark does not
pin a partition's tasks to one Python worker, and a task's worker that fenced the others to
write would also fence a new owner whenever a paused one woke up (docs/decisions.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Producer

from foldstream.changelog.batches import batch_headers, send_batch
from foldstream.errors import BrokerUnavailable
from foldstream.kafka import is_fenced, kafka_error_of, producer_config
from foldstream.state.held import ChangelogFenced

log = logging.getLogger(__name__)

#: How long a fence, a commit or an abort may take before it fails.
TRANSACTION_CALL_TIMEOUT_S = 30.0
#: How long the broker keeps a transaction open (a writer that stood still inside one) before
#: aborting it; the partition's next owner aborts it at once when it fences.
TRANSACTION_TIMEOUT_MS = 60_000
#: The largest record written (librdkafka's default ``message.max.bytes``, about the brokers'):
#: tasks keep values and keys below it with room for the headers.
MAX_RECORD_BYTES = 1_000_000
#: How long the producer holds records to batch them: a commit sends whatever it holds at once,
#: so this delays nothing; it only makes fewer, larger requests while a large chunk is queued.
LINGER_MS = 50


class ChangelogWriter:
    """Writes one store partition's changes to ``partition`` of ``topic``, one transaction per
    write; :meth:`fence` first. After a write fails the transaction is aborted and the next
    write may succeed; once fenced (or failed for good) it raises :class:`ChangelogFenced`."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        partition: int,
        timeout: float = TRANSACTION_CALL_TIMEOUT_S,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.transactional_id = f"{topic}.{partition}"
        self.timeout = timeout
        self._producer: Any = Producer(
            producer_config(
                bootstrap,
                linger_ms=LINGER_MS,
                **{
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "message.max.bytes": MAX_RECORD_BYTES,
                    # A rebuild's chunk changes up to a key per record: room for whole chunks.
                    "queue.buffering.max.messages": 1_000_000,
                    "batch.num.messages": 10_000,
                },
            )
        )
        self._dead: str | None = None  # why nothing can be written any more
        self._unaborted = False  # a failed transaction whose abort failed too

    @classmethod
    def fenced(cls, *, bootstrap: str, topic: str, partition: int) -> ChangelogWriter:
        """A writer of ``partition`` of ``topic`` that has fenced every earlier one."""
        writer = cls(bootstrap=bootstrap, topic=topic, partition=partition)
        try:
            writer.fence()
        except BaseException:
            writer.close()
            raise
        return writer

    def fence(self) -> None:
        """Fence every other writer of this partition (``init_transactions``): the broker
        refuses their writes from now on and aborts a transaction of theirs still open."""
        try:
            self._producer.init_transactions(self.timeout)
        except Exception as exc:
            raise BrokerUnavailable(
                f"cannot fence the earlier writers of {self.topic}/{self.partition} "
                f"(transactional id {self.transactional_id!r}): {exc}. Check that the brokers "
                "answer and that the principal may write that transactional id"
            ) from exc

    def write(
        self,
        changes: Mapping[bytes, bytes | None],
        *,
        source_offset: int,
        folded_from: int | None,
        epoch: int,
        source_id: str | None,
        position: int | None,
    ) -> int | None:
        """Write ``changes`` as one batch in one transaction (see
        :class:`~foldstream.state.held.ChangelogSink`); returns the offset of its last record,
        where a copy made from the state resumes (``position`` when there is nothing to write).

        Only this writer's committed transactions are read between the stored ``position`` and
        the new one: whatever else lies there is transaction markers, aborted records, or the
        records of an owner this writer fenced (of an older epoch, ignored by copies)."""
        if not changes:
            return position
        self._check_usable()
        landed: list[int] = []
        errors: list[str] = []

        def on_delivery(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                landed.append(message.offset())

        headers = batch_headers(source_offset, folded_from, epoch, source_id)
        try:
            self._producer.begin_transaction()
            send_batch(self._producer, self.topic, self.partition, changes, headers, on_delivery)
            self._producer.commit_transaction(self.timeout)
        except Exception as exc:
            raise self._failed(exc, errors) from exc
        if errors or len(landed) != len(changes):
            self._dead = f"committed, but delivery reports say {errors[:3]}"
            raise ChangelogFenced(f"{self.topic}/{self.partition}: {self._dead}")
        return max(landed)

    def _check_usable(self) -> None:
        if self._producer is None:
            self._dead = "closed"
        if self._dead is not None:
            raise ChangelogFenced(f"{self.topic}/{self.partition}: {self._dead}")
        if self._unaborted:
            try:
                self._producer.abort_transaction(self.timeout)
            except Exception as exc:
                raise self._failed(exc, []) from exc
            self._unaborted = False

    def _failed(self, exc: Exception, errors: list[str]) -> Exception:
        """What a failed transaction raises: :class:`ChangelogFenced` when another writer
        fenced this one (or it failed for good), else :class:`BrokerUnavailable` once the
        transaction is aborted (or left to abort before the next one)."""
        error = kafka_error_of(exc)
        if is_fenced(exc) or (error is not None and error.fatal()):
            self._dead = f"fenced by another writer ({exc})" if is_fenced(exc) else str(exc)
            return ChangelogFenced(f"{self.topic}/{self.partition}: {self._dead}")
        try:
            self._producer.abort_transaction(self.timeout)
        except Exception as abort_error:  # noqa: BLE001 - tried again before the next write
            if is_fenced(abort_error):
                self._dead = f"fenced by another writer ({abort_error})"
                return ChangelogFenced(f"{self.topic}/{self.partition}: {self._dead}")
            self._unaborted = True
        return BrokerUnavailable(
            f"changelog {self.topic}/{self.partition} did not take a transaction ({exc}; "
            f"{errors[:3]}): nothing of it is visible; the task is retried"
        )

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None or self._dead is not None:
            return  # a fenced producer has nothing to abort or flush: dropped
        try:
            producer.close()
        except Exception:  # noqa: BLE001 - a fenced producer: it is gone anyway
            log.debug(
                "closing the changelog writer %s failed", self.transactional_id, exc_info=True
            )
