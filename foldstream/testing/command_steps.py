"""Sentences about commands and the events they append: commands sent (and retried while their
partition moves), events appended by another producer or by a writer that keeps appending, and
what a command's answer and the events topic then hold (:mod:`foldstream.testing.steps` lists
the sentences)."""

from __future__ import annotations

import json
from datetime import datetime

import httpx
from confluent_kafka import Producer
from pytest_bdd import given, parsers, then, when
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from foldstream.kafka import partition_for, producer_config
from foldstream.process import InstanceProcess, http
from foldstream.testing.kafka import CommandWriter, append_events, log_ends, records_at
from foldstream.testing.scenario import NAME, ScenarioState, _aggregate_class, _rows, service_of


@given(
    parsers.re(
        rf'(?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)" accepted "(?P<command>{NAME})" '
        r"with (?P<arguments>.+)"
    )
)
def command_accepted(
    instance: InstanceProcess, aggregate: str, aggregate_id: str, command: str, arguments: str
) -> None:
    status, body = http(
        "POST",
        f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}",
        json.loads(arguments),
    )
    assert status == 200, body


_APPENDED = (
    rf'these events were appended to (?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)"'
    r'(?: in the partition of "(?P<beside>[^"]+)")?:'
)


@given(parsers.re(_APPENDED))
@when(parsers.re(_APPENDED))
def events_appended(
    instance: InstanceProcess,
    aggregate: str,
    aggregate_id: str,
    beside: str | None,
    datatable: list[list[str]],
) -> None:
    """A new aggregate's events (its Created event first), appended by another producer. A
    ``timestamp`` column (ISO-8601) sets the events' times (the Created event takes the first
    row's). ``in the partition of "k"``: the aggregate's id is ``aggregate_id`` followed by
    ``-<n>``, the first such id in the partition of ``k``."""
    cls = _aggregate_class(instance, aggregate)
    if beside is not None:
        wanted = partition_for(beside.encode(), instance.partitions)
        aggregate_id = next(
            f"{aggregate_id}-{n}"
            for n in range(10_000)
            if partition_for(f"{aggregate_id}-{n}".encode(), instance.partitions) == wanted
        )
    target = cls(id=aggregate_id)  # type: ignore[call-arg]
    rows = _rows(datatable)
    for row in rows:
        event_class = getattr(cls, row["type"], None)
        assert isinstance(event_class, type), f"{cls.__name__} has no event {row['type']!r}"
        arguments = json.loads(row.get("data") or "{}")
        if row.get("timestamp"):
            arguments["timestamp"] = datetime.fromisoformat(row["timestamp"])
        target.trigger_event(event_class, **arguments)
    if rows and rows[0].get("timestamp"):
        created = target.pending_events[0]
        object.__setattr__(created, "timestamp", datetime.fromisoformat(rows[0]["timestamp"]))
    _, settings = service_of(instance)
    producer = Producer(producer_config(instance.bootstrap))
    append_events(producer, settings.events_topic, target.collect_events())
    assert producer.flush(30) == 0


#: How long a command answered 503 (its partition still replayed or moving) is sent again.
COMMAND_RETRY_S = 60.0


@when(
    parsers.re(
        rf'(?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)" is sent "(?P<command>{NAME})" '
        r'with (?P<body>.*?)(?: and the query "(?P<query>[^"]*)")?'
    )
)
def send_command(
    instance: InstanceProcess,
    scenario_state: ScenarioState,
    aggregate: str,
    aggregate_id: str,
    command: str,
    body: str,
    query: str | None,
) -> None:
    """Sends ``body`` as it is written (so malformed JSON can be sent too), with ``query`` as
    the query string when one is given. A 503 (the partition is still being replayed or
    moved) is sent again, as a client does, for up to :data:`COMMAND_RETRY_S`; any other
    answer is the scenario's to check."""
    _, settings = service_of(instance)
    scenario_state.ends_before = log_ends(
        instance.bootstrap, settings.events_topic, instance.partitions
    )
    scenario_state.sent_key = aggregate_id
    url = f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}"
    if query is not None:
        url += f"?{query}"
    send = Retrying(
        stop=stop_after_delay(COMMAND_RETRY_S),
        wait=wait_fixed(0.2),
        retry=retry_if_result(lambda answer: answer[0] == 503),
        retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
    )
    scenario_state.response = send(http, "POST", url, body.encode())


@when(
    parsers.re(
        rf'(?P<aggregate>{NAME}) "(?P<aggregate_id>[^"]+)" is sent "(?P<command>{NAME})" '
        r'under Idempotency-Key "(?P<key>[^"]*)" with (?P<body>.*)'
    )
)
def send_keyed_command(
    instance: InstanceProcess,
    scenario_state: ScenarioState,
    aggregate: str,
    aggregate_id: str,
    command: str,
    key: str,
    body: str,
) -> None:
    """:func:`send_command` with the header ``Idempotency-Key: key``; the first 200 answer of
    each key is kept for ``the answer is the first one under Idempotency-Key``."""
    _, settings = service_of(instance)
    scenario_state.ends_before = log_ends(
        instance.bootstrap, settings.events_topic, instance.partitions
    )
    scenario_state.sent_key = aggregate_id
    url = f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}"
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    send = Retrying(
        stop=stop_after_delay(COMMAND_RETRY_S),
        wait=wait_fixed(0.2),
        retry=retry_if_result(lambda answer: answer.status_code == 503),
        retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
    )
    answer = send(httpx.post, url, content=body.encode(), headers=headers, timeout=30)
    scenario_state.response = (answer.status_code, answer.json())
    scenario_state.replayed = answer.headers.get("idempotent-replayed") == "true"
    if answer.status_code == 200:
        scenario_state.first_by_key.setdefault(key, scenario_state.response)


@then(parsers.parse('the answer is the first one under Idempotency-Key "{key}", marked replayed'))
def first_answer_again(scenario_state: ScenarioState, key: str) -> None:
    """The same events, position and token as the key's first 200, marked as a retry's."""
    assert key in scenario_state.first_by_key, f"no 200 under {key!r} yet"
    assert scenario_state.last_response() == scenario_state.first_by_key[key]
    assert scenario_state.replayed, "no Idempotent-Replayed: true on the answer"


@when(
    parsers.re(
        r'another writer keeps appending "(?P<command>[\w-]+)" with (?P<arguments>\{.*\}) '
        r"to (?:each of|(?P<per_round>\d+) at random of) "
        rf'(?P<count>\d+) (?P<aggregate>{NAME}) ids starting "(?P<prefix>[^"]+)"'
    )
)
def another_writer(
    instance: InstanceProcess,
    scenario_state: ScenarioState,
    command: str,
    arguments: str,
    per_round: str | None,
    count: str,
    aggregate: str,
    prefix: str,
) -> None:
    """Starts a :class:`CommandWriter` on ids ``<prefix>0`` to ``<prefix><count - 1>``, each
    round on all of them or on ``per_round`` drawn at random."""
    cls = _aggregate_class(instance, aggregate)
    _, settings = service_of(instance)
    scenario_state.writer = CommandWriter(
        bootstrap=instance.bootstrap,
        topic=settings.events_topic,
        aggregates=[cls(id=f"{prefix}{n}") for n in range(int(count))],  # type: ignore[call-arg]
        command=command,
        arguments=json.loads(arguments),
        per_round=None if per_round is None else int(per_round),
    ).start()


@when("the instance is killed while the writer is still appending")
def kill_mid_stream(instance: InstanceProcess, scenario_state: ScenarioState) -> None:
    """SIGKILL the instance's process group (the JVM and Spark's workers with it)."""
    assert scenario_state.writer is not None, "no writer was started"
    assert scenario_state.writer.is_alive(), f"the writer stopped: {scenario_state.writer.error}"
    instance.kill()


@when(parsers.parse("the writer appends {rounds:d} more rounds and stops"))
def writer_stops(scenario_state: ScenarioState, rounds: int) -> None:
    assert scenario_state.writer is not None, "no writer was started"
    scenario_state.writer.stop_after(rounds)


@then("the command appended these events:")
def command_appended(
    instance: InstanceProcess, scenario_state: ScenarioState, datatable: list[list[str]]
) -> None:
    """The answer lists the events, and Kafka holds them at the answered position, in the
    partition of the aggregate's key."""
    status, body = scenario_state.last_response()
    assert status == 200, body
    expected = [(r["type"], json.loads(r.get("data") or "{}")) for r in _rows(datatable)]
    answered = [
        (e["type"], {k: v for k, v in e.items() if k not in ("type", "version")})
        for e in body["events"]
    ]
    assert answered == expected
    partition, last = body["position"]["partition"], body["position"]["offset"]
    key = scenario_state.sent_key.encode()
    assert partition == partition_for(key, instance.partitions)
    definition, settings = service_of(instance)
    first = last - len(expected) + 1
    assert first == scenario_state.ends_before[partition], "other records landed in between"
    codec = definition.codec
    stored = records_at(instance.bootstrap, settings.events_topic, partition, first, last)
    decoded = [codec.decode(record) for record in stored]
    assert [r.key for r in stored] == [key] * len(expected)
    assert [type(e).__qualname__ for e in decoded] == [t for t, _ in expected]
    assert [e.originator_version for e in decoded] == [e["version"] for e in body["events"]]


@then(parsers.parse('the command is rejected with status {status:d} saying "{reason}"'))
def rejected(scenario_state: ScenarioState, status: int, reason: str) -> None:
    got_status, body = scenario_state.last_response()
    assert got_status == status, body
    assert reason in body["error"], body


@then("nothing was appended")
def nothing_appended(instance: InstanceProcess, scenario_state: ScenarioState) -> None:
    """The events topic ends where it ended before the command (a command answers only after
    its events are acknowledged, so an append would be visible already)."""
    _, settings = service_of(instance)
    after = log_ends(instance.bootstrap, settings.events_topic, instance.partitions)
    assert after == scenario_state.ends_before
