"""Steps for a standby copy held behind its changelog, for as long as a scenario wants::

    When a transaction left open on the changelog of store "stock" holds back the standby of "k-1"
    Then the owner of "k-1" in store "stock" answers {"on_hand": 10}
    Then the standby of "k-1" answers {"on_hand": 4} with max_lag its lag from the transaction
    Then the standby of "k-1" sends every read with a max_lag below its lag to the owner
    When the transaction is aborted

A copy reads its changelog's committed records only (``isolation.level=read_committed``), so
it cannot read past the first record of a transaction still open on its partition (the last
stable offset), while the owner's records after it land: the copy stays exactly that far
behind until the transaction ends, without touching the instance. (A writer killed in the
middle of a transaction leaves one open until the broker aborts it.) The transaction is
aborted when the scenario ends, whatever happened.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from pytest_bdd import parsers, then, when

from foldstream.kafka import consumer_config, producer_config
from foldstream.process import http
from foldstream.testing.cluster_steps import ClusterState, Store, answer_of
from foldstream.testing.steps import service_of, wait_until

#: Reads sent at each max_lag the held copy must not answer.
READS = 50
#: How long the broker keeps the transaction open at most, should the scenario's end not
#: abort it (a crash of the test process): the changelog's readers are then held no longer.
TRANSACTION_TIMEOUT_MS = 300_000


@dataclass
class Held:
    """The producers with a transaction open (aborted when the scenario ends), where the open
    transaction's record landed, and the lag the held standby said it had."""

    open: list[Producer] = field(default_factory=list)
    at: TopicPartition | None = None  # its offset: where the copies reading it stop
    lag: int | None = None


@pytest.fixture
def held() -> Iterator[Held]:
    state = Held()
    yield state
    for producer in state.open:
        producer.abort_transaction(30)


@when(
    parsers.parse(
        'a transaction left open on the changelog of store "{store}" holds back the standby '
        'of "{key}"'
    )
)
def hold_back(cluster_state: ClusterState, held: Held, store: str, key: str) -> None:
    """One record in a transaction left open on the changelog partition of ``key``: the
    copies reading it stop before it."""
    member = cluster_state.live()[0]
    _, settings = service_of(member)
    transactional: dict[str, Any] = {
        "transactional.id": f"held-standby-{uuid.uuid4().hex}",
        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
    }
    producer = Producer(producer_config(member.bootstrap, **transactional))
    producer.init_transactions(30)
    producer.begin_transaction()
    held.open.append(producer)
    partition = Store.of(member, store).partition(key)
    landed: list[Any] = []
    producer.produce(
        settings.changelog_topic(store),
        key=b"held",
        value=b"",
        partition=partition,
        on_delivery=lambda error, message: landed.append(error or message),
    )
    assert producer.flush(30) == 0 and landed, "the record of the open transaction was not sent"
    (message,) = landed
    assert not isinstance(message, KafkaError), message
    held.at = TopicPartition(message.topic(), message.partition(), message.offset())


@when("the transaction is aborted")
def abort(held: Held) -> None:
    assert held.open, "no transaction was left open in this scenario"
    held.open.pop().abort_transaction(30)


@then(parsers.parse('the owner of "{key}" in store "{store}" answers {value}'))
def owner_answers(cluster_state: ClusterState, key: str, store: str, value: str) -> None:
    """The owner the standby step found answers ``value`` itself, as the active copy: it has
    folded the events, and written their changelog records."""
    path = Store.of(cluster_state.live()[0], store).path(key)
    body = answer_of(cluster_state.owner + path, json.loads(value))
    assert body["served_by"]["role"] == "active", body


@then(
    parsers.parse(
        'the standby of "{key}" answers {value} with max_lag its lag from the transaction'
    )
)
def standby_answers_within(cluster_state: ClusterState, held: Held, key: str, value: str) -> None:
    """The standby's lag is the changelog records from the open transaction's (where it
    stops) to the end (the owner's among them); once it says so, a read allowing exactly that
    lag is answered by it, with the value its copy holds."""
    assert held.at is not None, "no transaction was left open in this scenario"
    lag = _high_watermark(cluster_state.live()[0].bootstrap, held.at) - held.at.offset
    assert lag > 1, f"no record of the owner's landed past the open transaction: lag {lag}"
    url = cluster_state.standby + cluster_state.standby_path
    seen: dict[str, Any] = {}

    def says_so() -> bool:
        status, body = http("GET", f"{url}?max_lag=1000000", follow_redirects=False)
        seen["answer"] = (status, body)
        return status == 200 and body["served_by"]["lag"] == lag

    wait_until(says_so, lambda: f"{url}: not {lag} behind: {seen}")
    status, body = http("GET", f"{url}?max_lag={lag}", follow_redirects=False)
    assert status == 200, (status, body)
    assert body["served_by"]["role"] == "standby" and body["served_by"]["lag"] == lag, body
    assert body["value"] == json.loads(value), body
    held.lag = lag


def _high_watermark(bootstrap: str, at: TopicPartition) -> int:
    """The partition's high watermark (past the open transaction's records, which a reader
    of committed records only is not told of)."""
    config = consumer_config(bootstrap)
    config["isolation.level"] = "read_uncommitted"
    reader = Consumer(config)
    try:
        _, high = reader.get_watermark_offsets(TopicPartition(at.topic, at.partition), timeout=30)
        return int(high)
    finally:
        reader.close()


@then(
    parsers.parse(
        'the standby of "{key}" sends every read with a max_lag below its lag to the owner'
    )
)
def standby_redirects_below(cluster_state: ClusterState, held: Held, key: str) -> None:
    """:data:`READS` reads at max_lag 0 and at its lag less one: each a 307 to the owner."""
    lag = held.lag
    assert lag is not None, "the standby's lag was not read in this scenario"
    url = cluster_state.standby + cluster_state.standby_path
    for max_lag in sorted({0, lag - 1}):
        for _ in range(READS):
            status, body = http("GET", f"{url}?max_lag={max_lag}", follow_redirects=False)
            assert status == 307, (max_lag, status, body)
            assert body["location"].startswith(cluster_state.owner + cluster_state.standby_path)
