"""Routing, standby reads, failover and restores on a cluster of three storefront instances.

Its own module: the cluster is started once for it (the inventory instance of the other
modules is stopped first, as both are the "inventory" service); the scenarios that kill or
restart an instance come last.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import httpx
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from pytest_bdd import parsers, scenarios, then, when

from foldstream.cluster.map import ASSIGNMENT_KEY
from foldstream.kafka import producer_config
from foldstream.kafka_client import admin_client
from foldstream.process import http
from foldstream.testing.cluster_steps import ClusterState, Store, cluster_view
from foldstream.testing.steps import REQUEST_ERRORS, service_of, wait_until

scenarios("cluster.feature")

#: Records no instance may act on: (key, value). Each is invalid, so each is counted.
FORGED: list[tuple[bytes, bytes]] = [
    (ASSIGNMENT_KEY, json.dumps({"generation": 1e308, "leader": "a", "members": ["a"]}).encode()),
    (ASSIGNMENT_KEY, b"[" * 100_000),
    (b"\xff\xfe-not-utf-8", json.dumps({"id": "x", "url": "http://127.0.0.1:9"}).encode()),
    (
        b"storefront-crlf",
        json.dumps({"id": "storefront-crlf", "url": "http://evil\r\nSet-Cookie: a=b"}).encode(),
    ),
    (
        b"storefront-epoch",
        json.dumps(
            {"id": "storefront-epoch", "url": "http://127.0.0.1:9", "epoch": 2**52}
        ).encode(),
    ),
    (
        b"storefront-types",
        json.dumps(
            {"id": "storefront-types", "url": "http://127.0.0.1:9", "active": {"t": "all"}}
        ).encode(),
    ),
    (b"storefront-huge", b'{"id": "storefront-huge", "pad": "' + b"x" * (2 << 20) + b'"}'),
]


@when("someone writes malformed and forged records to the cluster topic")
def forge_cluster_records(cluster_state: ClusterState) -> None:
    member = cluster_state.live()[0]
    cluster_state.before = {m.url: _invalid_records(m.url) for m in cluster_state.live()}
    producer = Producer(producer_config(member.bootstrap, **{"message.max.bytes": 8 << 20}))
    topic = service_of(member)[1].cluster_topic
    _allow_records_of(member.bootstrap, topic, 8 << 20)
    for key, value in FORGED:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def _allow_records_of(bootstrap: str, topic: str, size: int) -> None:
    """Let ``topic`` take records of ``size`` bytes (Kafka refuses those over 1 MB by default),
    as anyone allowed to alter its configuration could, so that the instances read the huge
    one."""
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes",
                str(size),
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    admin = admin_client(bootstrap)  # held until its futures are done
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _invalid_records(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(r"^foldstream_cluster_invalid_records_total (\S+)$", text, re.MULTILINE)
    assert found, "no foldstream_cluster_invalid_records_total in /metrics"
    return float(found.group(1))


@then("every instance counts them as invalid records of the cluster topic")
def counted_invalid(cluster_state: ClusterState) -> None:
    for member in cluster_state.live():
        before = cluster_state.before[member.url]
        wait_until(
            lambda member=member, before=before: (
                _invalid_records(member.url) >= before + len(FORGED)
            ),
            lambda member=member: f"{member.url} counted {_invalid_records(member.url)} invalid",
        )


@then("no instance redirects to a URL that is not a member's")
def redirects_to_members(cluster_state: ClusterState) -> None:
    members = cluster_state.live()
    urls = {m.url for m in members}
    view = cluster_view(members[0])
    assert {m["url"] for m in view["instances"]} == urls, view["instances"]
    store = Store.of(members[0], "stock")
    for n in range(40):
        key = f"forge-probe-{n}"
        for member in members:
            status, body = http("GET", member.url + store.path(key), follow_redirects=False)
            if status == 307:
                assert any(body["location"].startswith(url + "/") for url in urls), body


# The aggregate store and read-your-writes across a failover ------------------------------------


def _command_through_survivor(
    cluster_state: ClusterState, path: str, body: dict[str, Any]
) -> tuple[int, Any]:
    """The answer of a survivor (redirects followed), asked again while the partition is still
    moving (503, or a redirect to the killed owner)."""
    answer: dict[str, tuple[int, Any]] = {}

    def answered() -> bool:
        try:
            answer["last"] = http("POST", cluster_state.live()[0].url + path, body)
        except REQUEST_ERRORS as exc:
            answer["last"] = (0, repr(exc))
        return answer["last"][0] not in (0, 503)

    wait_until(answered, lambda: f"{path}: {answer.get('last')}")
    return answer["last"]


@then(
    parsers.re(
        r'through a survivor product "(?P<key>[^"]+)" sent "(?P<command>\w+)" with '
        r"(?P<body>\{.*\}) expecting version (?P<version>\d+) "
        r"(?:is accepted|is refused with 409 naming version (?P<current>\d+))"
    )
)
def expecting_version_after_failover(
    cluster_state: ClusterState,
    key: str,
    command: str,
    body: str,
    version: str,
    current: str | None,
) -> None:
    """Accepted (200, kept for the next steps), or refused with 409 naming ``current``."""
    path = f"/commands/product/{key}/{command}?expected_version={version}"
    status, answer = _command_through_survivor(cluster_state, path, json.loads(body))
    if current is None:
        assert status == 200, answer
        cluster_state.answers.append((status, answer))
    else:
        assert status == 409, answer
        assert answer["current_version"] == int(current), answer


@then(
    parsers.parse(
        'every survivor answers {value} for "{key}" in store "{store}" with that command\'s token'
    )
)
def survivors_read_the_command(
    cluster_state: ClusterState, value: str, key: str, store: str
) -> None:
    """The first answer other than 503 (redirects followed) is the state after the command."""
    token = cluster_state.answers[-1][1]["token"]
    for member in cluster_state.live():
        answer = _first_not_503(f"{member.url}/stores/{store}/keys/{key}", token)
        assert answer.status_code == 200, answer.text
        assert answer.json()["value"] == json.loads(value), answer.text


def _first_not_503(url: str, token: str, max_lag: int | None = None) -> httpx.Response:
    params = {"consistent_with": token} | ({} if max_lag is None else {"max_lag": str(max_lag)})
    answer: dict[str, httpx.Response | str] = {}

    def answered() -> bool:
        try:
            got = httpx.get(url, params=params, follow_redirects=True, timeout=30)
        except httpx.TransportError as exc:  # redirected to the killed owner: ask again
            answer["last"] = repr(exc)
            return False
        answer["last"] = got
        return got.status_code != 503

    wait_until(answered, lambda: f"{url}: {answer.get('last')}")
    found = answer["last"]
    assert isinstance(found, httpx.Response)
    return found


@when(
    parsers.re(
        r'product "(?P<key>[^"]+)" is sent "(?P<command>\w+)" with (?P<body>\{.*\}) '
        r"through the cluster"
    )
)
def command_through_cluster(cluster_state: ClusterState, key: str, command: str, body: str) -> None:
    path = f"/commands/product/{key}/{command}"
    status, answer = _command_through_survivor(cluster_state, path, json.loads(body))
    assert status == 200, answer
    cluster_state.answers.append((status, answer))


@then(
    parsers.parse(
        'a standby of "{key}" in store "{store}" answers {value} with that command\'s token'
    )
)
def standby_reads_the_command(
    cluster_state: ClusterState, key: str, store: str, value: str
) -> None:
    """The standby answers itself (``max_lag`` large: never redirected for its lag), and its
    first answer other than 503 is the state after the command: it waited for its copy."""
    token = cluster_state.answers[-1][1]["token"]
    members = cluster_state.live()
    _, owners = http("GET", f"{members[0].url}/stores/{store}/owners/{key}")
    assert owners["standbys"], f"no standby of {key}'s partition: {owners}"
    standby = owners["standbys"][0]["url"]
    answer = _first_not_503(f"{standby}/stores/{store}/keys/{key}", token, max_lag=10**9)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["served_by"]["role"] == "standby", body
    assert body["value"] == json.loads(value), body
