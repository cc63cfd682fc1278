"""Sentences about what stores serve: a key's value or error, a store as a plain fold of its
topic, and its changelog against what it serves (:mod:`foldstream.testing.steps` lists the
sentences)."""

from __future__ import annotations

import json
from typing import Any

from pytest_bdd import parsers, then, when

from foldstream.changelog import EPOCH_HEADER, SOURCE_OFFSET_HEADER
from foldstream.kafka import partition_for, read_to_end
from foldstream.process import InstanceProcess, http
from foldstream.projections.reference import fold_topic
from foldstream.testing.scenario import _source, lookup, service_of, wait_until


@then(parsers.parse('the store "{store}" returns {value} for "{key}"'))
def store_returns(instance: InstanceProcess, store: str, value: str, key: str) -> None:
    expected = (200, {"key": key, "value": json.loads(value)})
    last: dict[str, tuple[int, Any]] = {}

    def served() -> bool:
        last["answer"] = lookup(instance, store, key)
        return last["answer"] == expected

    wait_until(
        served,
        lambda: (
            f"{store}/{key} answered {last['answer']}, wanted {expected}; "
            f"/ready: {http('GET', f'{instance.url}/ready')}"
        ),
    )


@when(parsers.parse('the store "{store}" has a value for "{key}"'))
@then(parsers.parse('the store "{store}" has a value for "{key}"'))
def store_has_value(instance: InstanceProcess, store: str, key: str) -> None:
    wait_until(lambda: lookup(instance, store, key)[0] == 200, lambda: f"no {key!r} in {store}")


@then(parsers.parse('looking up "{key}" in store "{store}" answers {status:d} saying "{reason}"'))
def lookup_fails(instance: InstanceProcess, key: str, store: str, status: int, reason: str) -> None:
    got_status, body = lookup(instance, store, key)
    assert got_status == status, body
    assert reason in body["error"], body


@then(parsers.parse('the store "{store}" holds a plain fold of its topic'))
def store_is_plain_fold(instance: InstanceProcess, store: str) -> None:
    """Every key of the topic is served with the value a plain-Python fold of the whole topic
    gives, and deleted keys answer 404: nothing lost, nothing applied twice. (An ordered or
    windowed store: every key's range or windows, :mod:`foldstream.testing.ordered_steps`.)"""
    projection, topic, partitions = _source(instance, store)
    if projection.kind != "point":
        from foldstream.testing.ordered_steps import plain_fold_served

        plain_fold_served(instance, store, "range" if projection.kind == "ordered" else "windows")
        return
    # A key that is not UTF-8 (another producer's raw record) cannot be asked for over HTTP,
    # which answers such keys 400: the comparison is over the keys a client can look up.
    expected = {
        key: value
        for key, value in fold_topic(instance.bootstrap, projection, topic, partitions).items()
        if "\ufffd" not in key
    }
    assert expected, f"{topic} holds nothing to compare with"
    served: dict[str, Any] = {}

    def all_served() -> bool:
        for key in expected:
            status, body = lookup(instance, store, key)
            served[key] = body["value"] if status == 200 else None
        return served == expected

    wait_until(
        all_served,
        lambda: "; ".join(
            f"{k}: served {served[k]}, fold {v}" for k, v in expected.items() if served[k] != v
        ),
    )


@then(parsers.parse('the changelog of store "{store}" holds the served value of every key'))
def changelog_matches(instance: InstanceProcess, store: str) -> None:
    """The compacted changelog's latest value per key, in the key's partition and stamped with
    its source offset and its writer's epoch, is what the store serves."""
    projection, _, partitions = _source(instance, store)
    _, settings = service_of(instance)
    changelog = settings.changelog_topic(store)
    mismatched: list[str] = []

    def consistent() -> bool:
        latest: dict[bytes, bytes | None] = {}
        for batch in read_to_end(instance.bootstrap, changelog, partitions):
            for message in batch:
                key = message.key()
                assert message.partition() == partition_for(key, partitions, projection.partitioner)
                headers = dict(message.headers() or ())
                assert SOURCE_OFFSET_HEADER in headers
                assert int(headers[EPOCH_HEADER]) >= 1
                latest[key] = message.value()
        assert latest, f"{changelog} is empty"
        mismatched.clear()
        for key, value in latest.items():
            status, body = lookup(instance, store, key.decode())
            served = body["value"] if status == 200 else None
            if served != (None if value is None else json.loads(value)):
                mismatched.append(f"{key!r}: changelog {value!r}, served {served!r}")
        return not mismatched

    wait_until(consistent, lambda: "; ".join(mismatched))
