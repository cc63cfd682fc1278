"""``python -m bench.broker_history [--seconds S]``: how the embedded broker's costs grow with a
topic's history, the reason ``make bench`` gives each freshness and command round a broker of
its own.

Four transactional producers (one per partition, like the command side's) commit about 100
transactions/s of 8 records each; a plain consumer tails the topic (``fetch.wait.max.ms`` 10,
like the instance's). Every few seconds it prints the records so far, the broker's CPU and the
mean time of a transaction. Measured before the tailing consumer starts, then with it.
"""

from __future__ import annotations

import argparse
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.procs import cpu_seconds
from foldstream.broker import KafkaCluster
from foldstream.kafka import TopicSpec, consumer_config, ensure_topics, producer_config

PARTITIONS = 4
RECORDS_PER_TRANSACTION = 8
TRANSACTIONS_PER_SECOND = 100


class _Writers:
    """One transactional producer per partition, each on its share of the schedule."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.records = 0
        self.transactions: list[float] = []  # seconds each took
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write, args=(p,), daemon=True) for p in range(PARTITIONS)
        ]

    def _write(self, partition: int) -> None:
        producer = Producer(
            producer_config(self.bootstrap, **{"transactional.id": f"history-{partition}"})
        )
        producer.init_transactions(30)
        interval = PARTITIONS / TRANSACTIONS_PER_SECOND
        while not self._stop.is_set():
            started = time.perf_counter()
            producer.begin_transaction()
            for _ in range(RECORDS_PER_TRANSACTION):
                producer.produce(self.topic, key=b"k", value=b"v" * 200, partition=partition)
            producer.commit_transaction(30)
            took = time.perf_counter() - started
            self.transactions.append(took)
            self.records += RECORDS_PER_TRANSACTION
            time.sleep(max(0.0, interval - took))

    def __enter__(self) -> _Writers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _tail(bootstrap: str, topic: str, stop: threading.Event) -> None:
    consumer = Consumer(consumer_config(bootstrap, fetch_wait_max_ms=10))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    try:
        while not stop.is_set():
            if consumer.poll(0.1) is not None:
                consumer.consume(1000, 0)
    finally:
        consumer.close()


def _measure_growth(
    bootstrap: str, pid: int, writers: _Writers, seconds: float, steps: int
) -> None:
    def measure(what: str) -> None:
        cpu, started, done = cpu_seconds(pid), time.perf_counter(), len(writers.transactions)
        time.sleep(seconds)
        cores = (cpu_seconds(pid) - cpu) / (time.perf_counter() - started)
        recent = writers.transactions[done:]
        mean_ms = sum(recent) / len(recent) * 1e3 if recent else float("nan")
        print(
            f"{what:28} {writers.records:8,} records  broker {cores:.2f} cores  "
            f"transaction {mean_ms:.1f} ms",
            flush=True,
        )

    measure("producers alone")
    stop = threading.Event()
    tail = threading.Thread(target=_tail, args=(bootstrap, "history", stop))
    tail.start()
    try:
        for _ in range(steps):
            measure("+ 1 tailing consumer")
    finally:
        stop.set()
        tail.join()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_history", description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measurement")
    parser.add_argument("--steps", type=int, default=6, help="measurements with the consumer")
    args = parser.parse_args()
    with KafkaCluster() as broker:
        assert broker.pid is not None, "the broker is not running"
        pid = broker.pid
        ensure_topics(broker.bootstrap, [TopicSpec("history", PARTITIONS)])
        with _Writers(broker.bootstrap, "history") as writers:
            _measure_growth(broker.bootstrap, pid, writers, args.seconds, args.steps)


if __name__ == "__main__":
    main()
