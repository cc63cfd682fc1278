"""The true end of each partition of a topic, kept current by a tailing consumer.

Some Kafka-protocol brokers under-report the log end offset (ListOffsets, watermarks), which would
leave the tail of a partition unread forever. The end offsets here are instead learnt from data:
the consumer starts at the reported end, reads whatever lies beyond it, and records the offset
after the last record it saw or the end-of-partition position. This is correct on every broker,
and the only place in foldstream that needs to know about the problem.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

from foldstream.errors import BrokerUnavailable
from foldstream.kafka import consume_available, consumer_config


class EndOffsets:
    """Tracks ``{partition: end offset}`` of ``topic`` in a background thread."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: list[int], *, fetch_wait_max_ms: int = 10
    ) -> None:
        self.topic = topic
        self.partitions = list(partitions)
        self._ends: dict[int, int] = {}
        self._known: set[int] = set()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._consumer = Consumer(
            consumer_config(
                bootstrap,
                fetch_wait_max_ms=fetch_wait_max_ms,
                **{"fetch.message.max.bytes": 65536, "queued.max.messages.kbytes": 4096},
            )
        )
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in self.partitions])
        self._thread = threading.Thread(target=self._run, name=f"end-offsets-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            messages = consume_available(self._consumer, 10_000, 0.05)
            if not messages:
                continue
            with self._changed:
                for message in messages:
                    error = message.error()
                    partition = message.partition()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            continue
                        end = message.offset()
                        self._known.add(partition)
                    else:
                        end = message.offset() + 1
                    if end > self._ends.get(partition, -1):
                        self._ends[partition] = end
                self._changed.notify_all()

    def ends(self, timeout: float = 30.0) -> dict[int, int]:
        """The end offset of every partition; waits until each has been read to its end once."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._known) < len(self.partitions):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(self.partitions) - self._known)
                    raise BrokerUnavailable(
                        f"could not read to the end of {self.topic} partitions {missing} "
                        f"within {timeout}s"
                    )
                self._changed.wait(remaining)
            return dict(self._ends)

    def wait_beyond(self, offsets: dict[int, int], timeout: float) -> dict[int, int]:
        """Wait up to ``timeout`` until some partition's end passes ``offsets``; return the ends."""
        self.ends()
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(self._ends.get(p, 0) > o for p, o in offsets.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            ends = dict(self._ends)
        return ends

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._consumer.close()


def holds_records(
    bootstrap: str, topic: str, partition: int, start: int, end: int, *, timeout: float = 5.0
) -> bool:
    """Whether a consumer finds any record at offsets ``[start, end)`` of ``partition``.

    Some offsets hold no record a consumer is given: transaction markers (every committed
    transaction ends with one), records of aborted transactions, compacted-away records. So a
    store that applied everything up to ``start`` is caught up with ``end`` when this is False,
    although ``end - start > 0``.
    """
    if end <= start:
        return False
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            message = consumer.poll(remaining)
            if message is None:
                break
            error, offset = message.error(), message.offset()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise BrokerUnavailable(f"reading {topic}/{partition}: {error}")
            if offset is None:
                continue
            if error is None:
                return bool(offset < end)
            if offset >= end:
                return False
    finally:
        consumer.close()
    raise BrokerUnavailable(f"could not read {topic}/{partition} from {start} within {timeout}s")
