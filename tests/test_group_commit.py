"""Group commit: commands of a partition queued during a transaction share the next one."""

from __future__ import annotations

import asyncio

import pytest

from foldstream.broker import KafkaCluster
from foldstream.commands import CommandResult
from foldstream.domain.records import HEADER_VERSION
from foldstream.errors import BrokerUnavailable, NotOwner, PartitionFenced
from foldstream.testing.kafka import read_topic
from tests.test_command_ownership import (
    PARTITIONS,
    TakeOverBeforeCommit,
    events_in,
    handlers,
    key_in,
    new_topic,
    run,
)


def test_concurrent_commands_share_transactions_and_each_gets_its_own_offset(
    broker: KafkaCluster,
) -> None:
    topic = new_topic(broker)

    async def scenario() -> None:
        with handlers(broker, topic, 1) as (handler,):
            await asyncio.to_thread(handler.assign, range(PARTITIONS))
            keys = [key_in(handler, 2, f"group-{n}") for n in range(40)]
            results = await asyncio.gather(
                *(
                    handler.handle("product", key, "receive_shipment", {"quantity": n + 1})
                    for n, key in enumerate(keys)
                )
            )
            assert handler._committer.transactions < len(keys)
            records = {
                offset: (key.decode(), int(dict(headers)[HEADER_VERSION]))
                for partition, offset, key, _, headers in read_topic(
                    broker.bootstrap, topic, PARTITIONS
                )
                if partition == 2
            }
            assert len(records) == sum(len(r.events) for r in results)
            for key, result in zip(keys, results, strict=True):
                assert result.partition == 2
                assert records[result.offset] == (key, result.events[-1]["version"])

    run(scenario)


def test_a_failed_transaction_fails_every_command_in_it_and_after_it(
    broker: KafkaCluster,
) -> None:
    topic = new_topic(broker)

    async def scenario() -> None:
        with (
            handlers(broker, topic, 1, transaction_timeout=1.0) as (a,),
            handlers(broker, topic, 1) as (b,),
        ):
            await asyncio.to_thread(a.assign, range(PARTITIONS))
            key = key_in(a, 1, "doomed")
            await a.handle("product", key, "receive_shipment", {"quantity": 50})
            before = events_in(broker, topic, 1)
            writer = a._writers[1]
            writer._producer = TakeOverBeforeCommit(writer._producer, lambda: b.assign([1]))

            outcomes = await asyncio.gather(
                *(a.handle("product", key, "sell", {"quantity": 1}) for _ in range(10)),
                return_exceptions=True,
            )

            assert not [o for o in outcomes if isinstance(o, CommandResult)], outcomes
            assert all(
                isinstance(o, PartitionFenced | BrokerUnavailable | NotOwner) for o in outcomes
            ), outcomes
            with pytest.raises(NotOwner):
                await a.handle("product", key, "sell", {"quantity": 1})
            assert a._writers.get(1) is None and len(writer.aggregates) == 0
            # The new owner goes on from what its replay found in the log.
            version = b.version(key)
            assert version >= len(before)
            result = await b.handle(
                "product", key, "sell", {"quantity": 1}, expected_version=version
            )
            assert result.events[-1]["version"] == version + 1

    run(scenario)
