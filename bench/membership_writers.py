"""What a member of the membership bench (:mod:`bench.membership`) does with the partitions it
believes it owns, and how it says so.

Each member reports, as JSON lines on stdout stamped with the system-wide monotonic clock (one
clock for every process on the machine), the partitions it owns whenever that changes, its view
of every partition's owner, and the outcome of every write it makes.

A write is what foldstream's command side does with a partition it owns: it commits a
transaction through a producer whose ``transactional.id`` names the partition, opened with
``init_transactions`` when the partition is gained, which fences every earlier holder. A member
acting on stale ownership (after a pause) is then seen twice: its own writes fail as fenced, or
it fences the new owner's writer (the new owner's writes fail), which is what foldstream's
handover must never cause.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from foldstream.kafka import producer_config

#: Seconds between two writes to one owned partition.
WRITE_EVERY_S = 0.5
#: How long a write or a writer's start may take before it counts as failed.
WRITE_TIMEOUT_S = 10.0


class Reporter:
    """JSON lines on stdout, each stamped with ``time.monotonic()`` (one writer at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def say(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, "t": time.monotonic(), **fields})
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def owners(self, owners: Mapping[int, int | None]) -> None:
        self.say("view", owners={str(p): m for p, m in sorted(owners.items())})


class PartitionWriters:
    """One transactional writer per owned partition of ``topic`` (foldstream's command writers).

    Implements the command side's protocol the cluster code drives
    (:class:`~foldstream.cluster.handover.CommandPartitions`): :meth:`own` is called with every
    partition the member owns, each time that changes. A release returns once the partition's
    writer has stopped (a write or an ``init_transactions`` in flight ended): only then may
    the partition move, or the old writer's late ``init_transactions`` would fence the new
    owner's.
    """

    def __init__(self, *, bootstrap: str, service: str, topic: str, report: Reporter) -> None:
        self.bootstrap = bootstrap
        self.service = service
        self.topic = topic
        self._report = report
        self._owned: frozenset[int] = frozenset()
        self._writers: dict[int, tuple[threading.Thread, threading.Event]] = {}
        self._lock = threading.Lock()

    def own(self, partitions: Iterable[int]) -> None:
        owned = frozenset(partitions)
        with self._lock:
            if owned == self._owned:
                return
            released = [self._writers.pop(p) for p in self._owned - owned if p in self._writers]
            for _, stop in released:
                stop.set()
            for thread, _ in released:
                thread.join()
            for p in owned - self._owned:
                stop = threading.Event()
                thread = threading.Thread(target=self._write, args=(p, stop), daemon=True)
                self._writers[p] = (thread, stop)
                thread.start()
            self._owned = owned
            self._report.say("owned", owned=sorted(owned))

    def owned(self) -> frozenset[int]:
        return self._owned

    def _write(self, p: int, stop: threading.Event) -> None:
        config = producer_config(
            self.bootstrap, linger_ms=0, **{"transactional.id": f"{self.service}.writer.{p}"}
        )
        producer = Producer(config)
        started = time.monotonic()
        try:
            producer.init_transactions(WRITE_TIMEOUT_S)
        except KafkaException as exc:
            failed = f"init: {exc.args[0].name()}"
            self._report.say("write", p=p, ok=False, err=failed, began=started)
            return
        while not stop.is_set():
            began = time.monotonic()
            error = self._commit(producer, p, began)
            if error is None:
                self._report.say("write", p=p, ok=True, err=None, began=began)
            elif error.fatal():
                return  # fenced: written again only once the partition is gained again
            stop.wait(WRITE_EVERY_S)

    def _commit(self, producer: Any, p: int, began: float) -> KafkaError | None:
        """One transaction of one record to partition ``p``; its error (reported), or None."""
        try:
            producer.begin_transaction()
            producer.produce(self.topic, value=b"w", partition=p)
            producer.commit_transaction(WRITE_TIMEOUT_S)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            self._report.say("write", p=p, ok=False, err=error.name(), began=began)
            if error.txn_requires_abort():
                # If it fails, the next begin_transaction says what is wrong.
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(WRITE_TIMEOUT_S)
            return error
        return None
