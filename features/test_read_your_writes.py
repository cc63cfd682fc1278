"""Read-your-writes and the aggregate store, on the inventory example (one instance for the
module). The steps only this repo uses are here; the others come from
:mod:`foldstream.testing.steps`."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from pytest_bdd import parsers, scenarios, then, when
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from foldstream.kafka import partition_for
from foldstream.process import InstanceProcess, http
from foldstream.scrape import scrape
from foldstream.testing.steps import WAIT, ScenarioState, service_of
from foldstream.tokens import HEADER, parse_token, token_for

scenarios("read_your_writes.feature", "aggregate_store.feature")


def _token(scenario_state: ScenarioState) -> str:
    status, body = scenario_state.last_response()
    assert status == 200, body
    return str(body["token"])


def _until_not_503(ask: Any) -> httpx.Response:
    """The first answer that is not a 503 (a 503 says: ask again, with Retry-After), within
    ``WAIT``; the last 503 after that."""

    def unavailable(answer: httpx.Response) -> bool:
        if answer.status_code != 503:
            return False
        assert answer.headers.get("retry-after"), answer.text
        return True

    retrying = Retrying(
        stop=stop_after_delay(WAIT),
        wait=wait_fixed(0.05),
        retry=retry_if_result(unavailable),
        retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
    )
    answer: httpx.Response = retrying(ask)
    return answer


def _value_answered(url: str, value: str, **request: Any) -> None:
    """A lookup at ``url`` (with ``request``'s token) answers ``value``: the first answer, 503s
    aside, is the state after the command, never an older one."""
    answer = _until_not_503(lambda: httpx.get(url, timeout=30, **request))
    assert answer.status_code == 200, answer.text
    assert answer.json()["value"] == json.loads(value)


@then("the command's answer carries a consistency token")
def carries_token(instance: InstanceProcess, scenario_state: ScenarioState) -> None:
    _, body = scenario_state.last_response()
    token = parse_token(_token(scenario_state))
    assert (token.partition, token.offset) == (
        body["position"]["partition"],
        body["position"]["offset"],
    )
    _, settings = service_of(instance)
    assert token.of(settings.events_topic)


@then(parsers.parse('looking up "{key}" in store "{store}" after the command answers {value}'))
def lookup_after(
    instance: InstanceProcess, scenario_state: ScenarioState, key: str, store: str, value: str
) -> None:
    url = f"{instance.url}/stores/{store}/keys/{key}"
    _value_answered(url, value, params={"consistent_with": _token(scenario_state)})


@then(
    parsers.parse(
        'looking up "{key}" in store "{store}" with the command\'s token in the header '
        "answers {value}"
    )
)
def lookup_after_header(
    instance: InstanceProcess, scenario_state: ScenarioState, key: str, store: str, value: str
) -> None:
    url = f"{instance.url}/stores/{store}/keys/{key}"
    _value_answered(url, value, headers={HEADER.decode(): _token(scenario_state)})


@then(
    parsers.parse(
        'a batch lookup of "{key}" and "{other}" in store "{store}" after the command answers '
        '{value} for "{expected_key}"'
    )
)
def batch_after(
    instance: InstanceProcess,
    scenario_state: ScenarioState,
    key: str,
    other: str,
    store: str,
    value: str,
    expected_key: str,
) -> None:
    token = _token(scenario_state)
    url = f"{instance.url}/stores/{store}/keys"
    deadline = time.monotonic() + WAIT
    while True:
        answer = httpx.post(url, params={"consistent_with": token}, json=[key, other], timeout=30)
        assert answer.status_code == 200, answer.text
        found = answer.json()
        if key not in found["unavailable"] or time.monotonic() > deadline:
            break
    assert found["values"].get(expected_key) == json.loads(value), found
    assert other in found["missing"] or other in found["unavailable"], found


@then(
    parsers.re(
        r'looking up "(?P<key>[^"]+)" in store "(?P<store>[^"]+)" with the token '
        r'(?P<token>"[^"]*"|of the topic "[^"]+") answers 400 saying "(?P<reason>[^"]+)"'
    )
)
def lookup_bad_token(
    instance: InstanceProcess, key: str, store: str, token: str, reason: str
) -> None:
    if token.startswith("of the topic"):
        raw = token_for(token.split('"')[1], 0, 1)
    else:
        raw = json.loads(token)
    url = f"{instance.url}/stores/{store}/keys/{key}"
    for answer in (
        httpx.get(url, params={"consistent_with": raw}, timeout=30),
        httpx.get(url, headers={HEADER.decode(): raw}, timeout=30),
        httpx.post(url.rsplit("/", 1)[0], params={"consistent_with": raw}, json=[key], timeout=30),
    ):
        assert answer.status_code == 400, answer.text
        assert reason in answer.json()["error"], answer.text


@then(
    parsers.parse(
        'looking up "{key}" in store "{store}" with a token far past the end of its partition '
        "answers 503 with Retry-After"
    )
)
def lookup_unreached(instance: InstanceProcess, key: str, store: str) -> None:
    _, settings = service_of(instance)
    partition = partition_for(key.encode(), instance.partitions)
    token = token_for(settings.events_topic, partition, 10**15)
    answer = httpx.get(
        f"{instance.url}/stores/{store}/keys/{key}", params={"consistent_with": token}, timeout=30
    )
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"].isdigit(), answer.headers
    assert "not applied" in answer.json()["error"], answer.text


# The aggregate store ---------------------------------------------------------------------------


@when("the instance is killed with kill -9")
def kill_instance(instance: InstanceProcess) -> None:
    """SIGKILL the instance's process group (its JVM and Spark's workers with it)."""
    instance.kill()


@then("the command side replayed no event at its takeover")
def replayed_nothing(instance: InstanceProcess) -> None:
    name = "foldstream_command_replayed_events_total"
    found = [value for (sample, _), value in scrape(instance.url).items() if sample == name]
    assert found == [0.0], found


@then(
    parsers.re(
        r'(?P<aggregate>[\w-]+) "(?P<aggregate_id>[^"]+)" sent "(?P<command>[\w-]+)" with '
        r"(?P<body>\{.*\}) expecting version (?P<version>\d+) "
        r"(?:is accepted|is refused with 409 naming version (?P<current>\d+))"
    )
)
def expecting_version(
    instance: InstanceProcess,
    aggregate: str,
    aggregate_id: str,
    command: str,
    body: str,
    version: str,
    current: str | None,
) -> None:
    """Accepted (200), or refused with 409 naming the aggregate's ``current`` version."""
    status, answer = _command(instance, aggregate, aggregate_id, command, body, int(version))
    if current is None:
        assert status == 200, answer
    else:
        assert status == 409, answer
        assert answer["current_version"] == int(current), answer


def _command(
    instance: InstanceProcess,
    aggregate: str,
    aggregate_id: str,
    command: str,
    body: str,
    version: int,
) -> tuple[int, Any]:
    """The command's answer, asked again while it is 503 (the partition still being taken)."""
    url = f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}?expected_version={version}"
    deadline = time.monotonic() + WAIT
    while True:
        status, answer = http("POST", url, json.loads(body))
        if status != 503 or time.monotonic() > deadline:
            return status, answer
        time.sleep(0.05)  # the partition is being taken over: Retry-After says ask again
