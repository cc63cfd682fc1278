"""What a projection task does with a record it cannot fold: a poison record.

A record error is an exception raised while one record is decoded, folded or its new value
encoded (anything :meth:`Projection.apply` raises, but
:class:`~foldstream.errors.BrokerUnavailable`). The task tries the record again a few times
with short waits (:data:`RECORD_ATTEMPTS`, tenacity), so a passing failure still ends in the
record applied; a record that is not an event of the service at all
(:class:`~foldstream.errors.UndecodableRecord`) is not tried again. Then the store's policy
(``on_error``) decides: ``dead-letter`` sends the record to the store's dead-letter topic and
moves on, ``skip`` moves on, ``stop`` stops folding the partition at the record. A record that
is moved past leaves its key's value as it was.

Errors of the infrastructure (Kafka, the store host, the changelog's acknowledgements) are
never record errors: they fail the task, which Spark retries, and never move past a record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Producer
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from foldstream.domain.records import EventRecord
from foldstream.errors import BrokerUnavailable, UndecodableRecord
from foldstream.kafka import produce_when_room
from foldstream.projections.projection import ErrorPolicy

log = logging.getLogger(__name__)

#: Attempts at folding a record before its store's policy applies, and the first wait between
#: them (doubling, at most :data:`RECORD_RETRY_MAX_WAIT_S`).
RECORD_ATTEMPTS = 3
RECORD_RETRY_WAIT_S = 0.05
RECORD_RETRY_MAX_WAIT_S = 1.0
#: Bytes of the error's text a dead-letter record carries at most.
ERROR_HEADER_BYTES = 1000
#: A store's poison records are logged once per this many seconds at most, with a count.
LOG_INTERVAL_S = 10.0

# Headers a dead-letter record carries besides the original record's own.
DLQ_ERROR_HEADER = "foldstream-dlq-error"  # "<ExceptionType>: <message>", UTF-8, bounded
DLQ_STORE_HEADER = "foldstream-dlq-store"
DLQ_TOPIC_HEADER = "foldstream-dlq-topic"  # the source record's topic, partition and offset
DLQ_PARTITION_HEADER = "foldstream-dlq-partition"
DLQ_OFFSET_HEADER = "foldstream-dlq-offset"
DLQ_VALUE_OMITTED_HEADER = "foldstream-dlq-value-omitted"  # the value's size, if it was left out
DLQ_KEY_OMITTED_HEADER = "foldstream-dlq-key-omitted"  # the key's size, if it was left out

#: What became of a poison record, as the task reports it (the metric's ``outcome`` label).
DEAD_LETTERED, SKIPPED, STOPPED = "dead_lettered", "skipped", "stopped"

NO_KEY = "a record without a key cannot be folded: a store's values are kept by key"

Apply = Callable[[bytes | None, EventRecord], bytes | None]


def describe(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, however the exception renders itself."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails is still reported
        text = "(its message could not be rendered)"
    return f"{type(error).__name__}: {text}"


def bounded_utf8(text: str, limit: int = ERROR_HEADER_BYTES) -> bytes:
    """``text`` as valid UTF-8 of at most ``limit`` bytes (cut at a character, ``...`` added;
    characters that cannot be encoded, such as lone surrogates, replaced by ``?``)."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return data
    return data[: max(0, limit - 3)].decode("utf-8", errors="ignore").encode() + b"..."


class ValueTooLarge(ValueError):
    """The value a record folds to is larger than a changelog record may be
    (:data:`~foldstream.projections.task_output.MAX_VALUE_BYTES`): the store could not keep
    its changelog, so the record is poison.

    Remedy: keep less per key in the fold, or split the state over more keys.
    """


def _retryable(error: BaseException) -> bool:
    # A record that is not an event of the service, or that folds to a value too large, fails
    # the same way every time.
    return not isinstance(error, UndecodableRecord | ValueTooLarge | BrokerUnavailable)


def apply_retried(
    apply: Apply, current: bytes | None, record: EventRecord, error: Exception
) -> bytes | None:
    """The value of ``apply(current, record)`` after its first attempt raised ``error``,
    trying again until :data:`RECORD_ATTEMPTS` attempts in all; raises the last error."""
    attempts = Retrying(
        stop=stop_after_attempt(RECORD_ATTEMPTS),
        wait=wait_exponential(multiplier=RECORD_RETRY_WAIT_S, max=RECORD_RETRY_MAX_WAIT_S),
        retry=retry_if_exception(_retryable),
        reraise=True,
    )
    first = True
    for attempt in attempts:
        with attempt:
            if first:  # the attempt made already, so that tenacity waits before the next
                first = False
                raise error
            return apply(current, record)
    raise AssertionError("unreachable: tenacity raises the last error")  # pragma: no cover


class PoisonPolicy(NamedTuple):
    """How a task handles the poison records of ``partition`` of ``source_topic``, folded
    into ``store``: its ``on_error``, and where dead letters go (``producer`` to
    ``dead_letter_topic``, the same partition)."""

    store: str
    on_error: ErrorPolicy
    source_topic: str
    partition: int
    producer: Producer | None = None
    dead_letter_topic: str | None = None

    def handle(
        self,
        offset: int,
        record: EventRecord,
        error: BaseException,
        on_delivery: Callable[[Any, Any], None],
    ) -> str:
        """Dead-letter (queued with ``on_delivery``) or skip ``record`` (policy ``stop`` is the
        caller's: it ends the chunk); returns :data:`DEAD_LETTERED` or :data:`SKIPPED`."""
        text = describe(error)
        if self.on_error == "dead-letter":
            if self.producer is None or self.dead_letter_topic is None:
                raise error  # nowhere to put it: fail as before rather than lose it
            self._send(offset, record, text, on_delivery)
            _log_rate_limited(self, DEAD_LETTERED, offset, text)
            return DEAD_LETTERED
        _log_rate_limited(self, SKIPPED, offset, text)
        return SKIPPED

    def _send(
        self,
        offset: int,
        record: EventRecord,
        error: str,
        on_delivery: Callable[[Any, Any], None],
    ) -> None:
        assert self.producer is not None and self.dead_letter_topic is not None
        headers: list[tuple[str, bytes | None]] = [
            *record.headers,
            (DLQ_ERROR_HEADER, bounded_utf8(error)),
            (DLQ_STORE_HEADER, self.store.encode()),
            (DLQ_TOPIC_HEADER, self.source_topic.encode()),
            (DLQ_PARTITION_HEADER, str(self.partition).encode()),
            (DLQ_OFFSET_HEADER, str(offset).encode()),
        ]
        ours = headers[len(record.headers) :]
        omitted = [
            # The error's headers pushed a record near the size limit over it: without its
            # value (and, if its key alone is that large, without its key), its coordinates
            # still find it in the source topic.
            (DLQ_VALUE_OMITTED_HEADER, str(len(record.value or b"")).encode()),
            (DLQ_KEY_OMITTED_HEADER, str(len(record.key or b"")).encode()),
        ]
        attempts = [
            (record.key, record.value, headers),
            (record.key, None, [*ours, omitted[0]]),
            (None, None, [*ours, *omitted]),
        ]
        for n, (key, value, sent_headers) in enumerate(attempts, start=1):
            try:
                produce_when_room(
                    self.producer,
                    self.dead_letter_topic,
                    wait_s=0.01,
                    key=key,
                    value=value,
                    headers=sent_headers,
                    partition=self.partition,
                    on_delivery=on_delivery,
                )
                return
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE or n == len(attempts):
                    raise


_log_lock = threading.Lock()
_logged_at: dict[tuple[str, str], float] = {}
_unlogged: Counter[tuple[str, str]] = Counter()


def _log_rate_limited(policy: PoisonPolicy, outcome: str, offset: int, error: str) -> None:
    """Log a poison record, once per :data:`LOG_INTERVAL_S` per store and outcome at most
    (with the number left unlogged since): a topic full of them must not flood the log."""
    what = (policy.store, outcome)
    now = time.monotonic()
    with _log_lock:
        if now - _logged_at.get(what, -LOG_INTERVAL_S) < LOG_INTERVAL_S:
            _unlogged[what] += 1
            return
        _logged_at[what] = now
        unlogged = _unlogged.pop(what, 0)
    log.warning(
        "store %s %s the record at %s/%d offset %d: %s%s",
        policy.store,
        outcome.replace("_", "-"),
        policy.source_topic,
        policy.partition,
        offset,
        error[:ERROR_HEADER_BYTES],
        f" ({unlogged} more since the last message)" if unlogged else "",
    )
