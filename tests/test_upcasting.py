"""Events stored in an old shape are read through their upcaster, on a real instance (broker,
Spark, RocksDB, HTTP) of :mod:`foldstream.testing.ledger`: by the command side's replay, by
the folds, and by both again after the instance restored its stores from the changelogs.

The old events are the records version 1 of ``Account.Deposited`` wrote (whole ``euros``, no
``class_version``), appended to the events topic before the instance that reads them starts:
once before its first start (replayed from offset 0, folded from the start), once while it is
stopped and its state directory deleted (replayed after the restored snapshots, folded after
the restored values).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.domain import EventCodec, EventRecord
from foldstream.kafka import producer_config
from foldstream.preflight import prepare
from foldstream.process import InstanceProcess, http
from foldstream.settings import Settings
from foldstream.testing.ledger import Account, service

SERVICE = "foldstream.testing.ledger:service"
PARTITIONS = 2
CODEC = EventCodec([Account])


def as_version_1(record: EventRecord) -> EventRecord:
    """``record`` as version 1 wrote it: a deposit in whole euros, without ``class_version``
    (other events kept their shape)."""
    state = json.loads(record.value or b"{}")
    if state.pop("class_version", 1) == 2:
        state["euros"] = state.pop("cents") // 100
    return record._replace(value=json.dumps(state).encode())


def opened_by_version_1(account: str, euros: list[int]) -> list[EventRecord]:
    """A new account's events (created, then a deposit of each of ``euros``), as version 1
    wrote them."""
    aggregate = Account(id=account)
    for amount in euros:
        aggregate.deposit(amount * 100)
    return [as_version_1(CODEC.encode(e)) for e in aggregate.collect_events()]


def deposits_by_version_1(account: str, version: int, euros: list[int]) -> list[EventRecord]:
    """Deposits of ``euros`` to an account at ``version``, as version 1 wrote them."""
    return [
        as_version_1(
            CODEC.encode(
                Account.Deposited(
                    originator_id=account,
                    originator_version=version + n,
                    timestamp=datetime.now(UTC),
                    cents=amount * 100,
                )
            )
        )
        for n, amount in enumerate(euros, start=1)
    ]


def append(bootstrap: str, records: list[EventRecord]) -> None:
    """To ``ledger.events``, in the partition of each key (murmur2, as the command side)."""
    producer = Producer(producer_config(bootstrap))
    for record in records:
        producer.produce(
            "ledger.events", key=record.key, value=record.value, headers=list(record.headers)
        )
    assert producer.flush(30) == 0


def eventually(check: Callable[[], Any], describe: Callable[[], str], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {describe()}"
        time.sleep(0.1)
    return found


@pytest.fixture(scope="module")
def ledger(
    broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InstanceProcess]:
    """The ledger's topics, created before anything is written to them; its instance is
    started by the tests."""
    state_dir = tmp_path_factory.mktemp("ledger") / "state"
    settings = Settings(
        service="ledger",
        bootstrap_servers=broker.bootstrap,
        partitions=PARTITIONS,
        state_dir=state_dir,
    )
    prepare(service, settings)
    instance = InstanceProcess(
        bootstrap=broker.bootstrap, state_dir=state_dir, service=SERVICE, partitions=PARTITIONS
    )
    try:
        yield instance
    finally:
        instance.stop()


def balance_of(instance: InstanceProcess, account: str, wanted: dict[str, int]) -> None:
    """The ``balances`` store answers ``wanted`` for ``account`` (once it has folded it)."""
    seen: dict[str, Any] = {}

    def folded() -> bool:
        seen["answer"] = http("GET", f"{instance.url}/stores/balances/keys/{account}")
        return seen["answer"] == (200, {**seen["answer"][1], "value": wanted})

    eventually(folded, lambda: f"{account}: {seen.get('answer')}, wanted {wanted}")


def withdraw(
    instance: InstanceProcess, account: str, cents: int, expected_version: int | None = None
) -> tuple[int, Any]:
    """The answer to a withdrawal, sent again while its partition is still replayed (503)."""
    query = "" if expected_version is None else f"?expected_version={expected_version}"
    url = f"{instance.url}/commands/account/{account}/withdraw{query}"
    answered: dict[str, tuple[int, Any]] = {}

    def not_503() -> bool:
        answered["last"] = http("POST", url, {"cents": cents})
        return answered["last"][0] != 503

    eventually(not_503, lambda: f"{url}: {answered.get('last')}")
    return answered["last"]


def test_old_events_are_read_through_the_upcaster_by_replays_folds_and_restores(
    ledger: InstanceProcess, broker: KafkaCluster
) -> None:
    append(
        broker.bootstrap, opened_by_version_1("old-1", [5, 7]) + opened_by_version_1("old-2", [3])
    )
    ledger.start().wait_ready()
    replayed_and_folded_from_the_start(ledger)
    # Stopped, its state directory deleted, and old events appended meanwhile: the instance
    # restores snapshots and values from the changelogs, then reads the old events past them.
    ledger.stop()
    shutil.rmtree(ledger.state_dir)
    append(
        broker.bootstrap,
        deposits_by_version_1("old-1", 4, [2]) + opened_by_version_1("old-3", [4]),
    )
    log_start = ledger.log_path.stat().st_size
    ledger.start().wait_ready()
    replayed_and_folded_after_a_restore(ledger)
    restored = re.findall(r"after restoring (\d+) changelog records", _log_since(ledger, log_start))
    assert sum(map(int, restored)) > 0, f"nothing restored:\n{ledger.log_tail()}"


def replayed_and_folded_from_the_start(ledger: InstanceProcess) -> None:
    balance_of(ledger, "old-1", {"cents": 1200, "deposits": 2})
    balance_of(ledger, "old-2", {"cents": 300, "deposits": 1})
    # The replay gave old-1 its 1200 cents at version 3 (created, two deposits): all of it
    # can be taken out, not a cent more.
    status, answer = withdraw(ledger, "old-1", 1200, expected_version=3)
    assert status == 200, answer
    assert withdraw(ledger, "old-1", 1) == (422, {"error": "cannot withdraw 1 cents: 0 in old-1"})
    assert withdraw(ledger, "old-2", 301) == (
        422,
        {"error": "cannot withdraw 301 cents: 300 in old-2"},
    )
    balance_of(ledger, "old-1", {"cents": 0, "deposits": 2})


def replayed_and_folded_after_a_restore(ledger: InstanceProcess) -> None:
    """old-1: 0 cents at version 4 restored, then a deposit of 2 euros; old-3: only old
    events, none of them in a snapshot."""
    balance_of(ledger, "old-1", {"cents": 200, "deposits": 3})
    balance_of(ledger, "old-2", {"cents": 300, "deposits": 1})
    balance_of(ledger, "old-3", {"cents": 400, "deposits": 1})
    status, answer = withdraw(ledger, "old-1", 200, expected_version=5)
    assert status == 200, answer
    assert withdraw(ledger, "old-3", 401) == (
        422,
        {"error": "cannot withdraw 401 cents: 400 in old-3"},
    )


def _log_since(instance: InstanceProcess, offset: int) -> str:
    with open(instance.log_path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")
