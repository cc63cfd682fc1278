"""A cluster of two real instances requiring a bearer token for commands and queries, and what
HTTP clients do with the token when a member redirects them (307) to another member.

Found here: urllib follows a GET's 307 and keeps ``Authorization`` across hosts (it copies
every header it was given), but does not follow a POST's 307; httpx follows both and drops
``Authorization`` whenever the scheme, host or port changes (another member is another port,
or host), so the member it lands on answers 401. The safe ways: route by ``GET /cluster``
(a smart client sends each request to the owner itself), or re-attach the token to requests
for members of the cluster map, and only those (an httpx request hook).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from foldstream.broker import KafkaCluster
from foldstream.kafka import partition_for
from foldstream.process import InstanceProcess, http, wait_cluster_stable
from foldstream.testing.steps import wait_until

TOKEN = "cluster-token-" + uuid.uuid4().hex
BEARER = {"Authorization": f"Bearer {TOKEN}"}
PARTITIONS = 4


@pytest.fixture(scope="module")
def members(
    broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[InstanceProcess]]:
    """Two instances of the inventory example; the token is required for queries too, and
    ``/cluster`` stays open beside the probes (smart clients read it)."""
    root = tmp_path_factory.mktemp("auth-cluster")
    env = {
        "FOLDSTREAM_AUTH_TOKEN": TOKEN,
        "FOLDSTREAM_AUTH_QUERIES": "true",
        "FOLDSTREAM_AUTH_OPEN_PATHS": "/health,/ready,/metrics,/cluster",
    }
    started = [
        InstanceProcess(
            bootstrap=broker.bootstrap,
            state_dir=root / f"member-{n}",
            service="foldstream.examples.inventory:service",
            partitions=PARTITIONS,
            env=env,
        )
        for n in range(2)
    ]
    try:
        for member in started:
            member.start()
        for member in started:
            member.wait_ready()
        wait_cluster_stable(started)
        yield started
    finally:
        for member in started:
            member.stop()


def _owner(members: list[InstanceProcess], key: str) -> str:
    view = http("GET", f"{members[0].url}/cluster")[1]
    return str(
        view["partitions"]["inventory.events"][str(partition_for(key.encode(), PARTITIONS))][
            "active"
        ]
    )


def _key_owned_by(members: list[InstanceProcess], url: str) -> str:
    for _ in range(1000):
        key = f"auth-{uuid.uuid4().hex[:10]}"
        if _owner(members, key) == url:
            return key
    raise AssertionError(f"no key owned by {url}")


def _send(
    url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None
) -> int:
    """The final status of a urllib request (urllib follows the redirects it follows)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def key_on_second(members: list[InstanceProcess]) -> str:
    """A key owned by the second member, with a value in its store."""
    second = members[1].url
    key = _key_owned_by(members, second)
    command = f"{second}/commands/product/{key}/receive_shipment"
    assert _send(command, "POST", {"quantity": 3}, BEARER) == 200
    wait_until(
        lambda: _send(f"{second}/stores/stock/keys/{key}", headers=BEARER) == 200,
        lambda: f"{key} not folded",
    )
    return key


def test_requests_without_the_token_get_401_probes_do_not(
    members: list[InstanceProcess], key_on_second: str
) -> None:
    url = members[1].url
    command = f"{url}/commands/product/{key_on_second}/sell"
    assert _send(command, "POST", {"quantity": 1}) == 401
    assert _send(command, "POST", {"quantity": 1}, {"Authorization": "Bearer wrong"}) == 401
    assert _send(f"{url}/stores/stock/keys/{key_on_second}") == 401
    assert _send(f"{url}/stores/stock/keys", "POST", [key_on_second]) == 401
    for path in ("/health", "/metrics", "/cluster"):
        assert _send(f"{url}{path}") == 200, path
    assert _send(f"{url}/ready") in (200, 503)  # open; 503 while a fold catches up
    response = httpx.get(f"{url}/stores/stock/keys/{key_on_second}")
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
    assert "Authorization" in response.json()["error"]


def test_urllib_keeps_the_token_across_a_lookup_redirect_but_does_not_follow_a_post(
    members: list[InstanceProcess], key_on_second: str
) -> None:
    first = members[0].url
    assert _send(f"{first}/stores/stock/keys/{key_on_second}", headers=BEARER) == 200
    command = f"{first}/commands/product/{key_on_second}/receive_shipment"
    assert _send(command, "POST", {"quantity": 1}, BEARER) == 307  # not followed for a POST


def test_httpx_drops_the_token_on_a_redirect_to_another_member(
    members: list[InstanceProcess], key_on_second: str
) -> None:
    first = members[0].url
    with httpx.Client(headers=BEARER, follow_redirects=True) as client:
        response = client.get(f"{first}/stores/stock/keys/{key_on_second}")
        assert [r.status_code for r in response.history] == [307]
        assert response.status_code == 401  # the second member saw no token
        assert "authorization" not in response.request.headers
        command = f"{first}/commands/product/{key_on_second}/receive_shipment"
        response = client.post(command, json={"quantity": 1})
        assert [r.status_code for r in response.history] == [307]
        assert response.status_code == 401


def test_safe_ways_routing_by_the_cluster_map_or_reattaching_for_members(
    members: list[InstanceProcess], key_on_second: str
) -> None:
    first = members[0].url
    view = httpx.get(f"{first}/cluster").json()
    trusted = {httpx.URL(m["url"]).netloc for m in view["instances"]}

    def reattach(request: httpx.Request) -> None:
        """Send the token to members of the cluster map only: never to any other host."""
        if request.url.netloc in trusted:
            request.headers["Authorization"] = BEARER["Authorization"]

    with httpx.Client(follow_redirects=True, event_hooks={"request": [reattach]}) as client:
        response = client.get(f"{first}/stores/stock/keys/{key_on_second}")
        assert [r.status_code for r in response.history] == [307]
        assert response.status_code == 200 and response.json()["value"]["on_hand"] >= 3
        command = f"{first}/commands/product/{key_on_second}/receive_shipment"
        response = client.post(command, json={"quantity": 1})
        assert response.status_code == 200, response.text

    # A smart client asks the owner directly: no redirect at all.
    owner = _owner(members, key_on_second)
    with httpx.Client(headers=BEARER) as client:
        response = client.get(f"{owner}/stores/stock/keys/{key_on_second}")
        assert response.status_code == 200 and not response.history
