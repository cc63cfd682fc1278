"""Suspects: an owner that stands still (SIGSTOP of its own process, as a long pause would) is
suspected by the others within a second or two, long before the session timeout (20 s here, so
that every check runs while it is a suspect rather than dead); nothing is sent to it meanwhile.
Each check ends by making sure the owner was still a suspect, not dropped out, when it ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from foldstream.client import FoldstreamClient
from foldstream.process import InstanceProcess, http
from foldstream.testing.cluster_steps import ClusterState, Store, cluster_view, member_ids
from foldstream.testing.plugin import InstancePool
from foldstream.testing.query_load import request
from foldstream.testing.steps import wait_until
from tests.browser import Browser, Page

scenarios("suspects.feature")

SERVICE = "foldstream.examples.inventory:service"


@dataclass
class Suspect:
    """The member standing still, the others, and its partitions and keys."""

    member: InstanceProcess | None = None
    others: list[InstanceProcess] = field(default_factory=list)
    store: Store | None = None
    partitions: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    paused: bool = False
    paused_at: float = 0.0

    @property
    def url(self) -> str:
        assert self.member is not None, "nobody stands still in this scenario"
        return self.member.url

    def resume(self) -> None:
        if self.member is not None and self.member.process is not None and self.paused:
            os.kill(self.member.process.pid, signal.SIGCONT)
        self.paused = False


@pytest.fixture
def suspect() -> Iterator[Suspect]:
    state = Suspect()
    yield state
    state.resume()  # the scenario failed while it stood still


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    browser = Browser()
    try:
        yield browser.new_page()
    finally:
        browser.close()


def _value(key: str) -> dict[str, int]:
    """What ``late-<n>`` holds: ``receive_shipment`` of ``n``."""
    return {"on_hand": int(key.rpartition("-")[2])}


def _from_standby(url: str) -> object:
    """The value the standby copy asked answers itself (None: it sends the read elsewhere)."""
    status, _, body = request(url)
    return body["value"] if status == 200 and body["served_by"]["role"] == "standby" else None


def suspected_by(instance: InstanceProcess, url: str) -> bool | None:
    """Whether ``instance``'s map lists the member at ``url`` as a suspect (None: not at all)."""
    members = {m["url"]: m for m in cluster_view(instance)["instances"]}
    return members[url]["suspect"] if url in members else None


def still_suspected(suspect: Suspect) -> None:
    """The check just made ran while the member was a suspect, not after it dropped out."""
    print(f"checked {time.monotonic() - suspect.paused_at:.1f}s into the pause")
    for other in suspect.others:
        assert suspected_by(other, suspect.url) is True, f"{other.url}: {cluster_view(other)}"


@given(
    parsers.parse(
        "a cluster of {size:d} instances of the inventory example with a session timeout of "
        "{seconds:d} seconds"
    ),
    target_fixture="instance",
)
def slow_cluster(
    instances: InstancePool, cluster_state: ClusterState, size: int, seconds: int
) -> InstanceProcess:
    cluster_state.members = instances.cluster(SERVICE, size, session_timeout_ms=seconds * 1000)
    return cluster_state.members[0]


@when(
    parsers.parse(
        'the owner of "{key}" in store "{store}" stands still until every other instance '
        "suspects it"
    )
)
def stands_still(
    cluster_state: ClusterState, suspect: Suspect, page: Page, key: str, store: str
) -> None:
    """Pauses the owner once every standby copy of its partitions holds its keys, with the
    dashboard of another instance open (a browser starts slowly), until the others suspect
    it."""
    members = cluster_state.live()
    where = suspect.store = Store.of(members[0], store)
    view = cluster_view(members[0])
    owner = view["partitions"][where.topic][str(where.partition(key))]["active"]
    suspect.member = next(m for m in members if m.url == owner)
    suspect.others = [m for m in members if m is not suspect.member]
    suspect.partitions = [
        int(p) for p, entry in view["partitions"][where.topic].items() if entry["active"] == owner
    ]
    suspect.keys = [k for k in cluster_state.keys if where.partition(k) in suspect.partitions]
    for k in suspect.keys:  # first every standby copy of its partitions holds its keys
        entry = view["partitions"][where.topic][str(where.partition(k))]
        for url in [f"{copy['url']}{where.path(k)}?max_lag=0" for copy in entry["standbys"]]:
            wait_until(lambda u=url, k=k: _from_standby(u) == _value(k), lambda u=url: u)  # type: ignore[misc]
    page.goto(f"{suspect.others[0].url}/ui/")
    page.wait_for("document.querySelectorAll('#members tbody tr').length === 3")
    assert suspect.member.process is not None
    os.kill(suspect.member.process.pid, signal.SIGSTOP)
    suspect.paused_at = time.monotonic()
    suspect.paused = True
    wait_until(
        lambda: all(suspected_by(o, owner) for o in suspect.others),
        lambda: f"not suspected: {[cluster_view(o)['instances'] for o in suspect.others]}",
    )


@then("the others' cluster maps list it as a suspect, naming no owner for its partitions")
def maps_name_no_owner(suspect: Suspect) -> None:
    assert suspect.store is not None
    for other in suspect.others:
        view = cluster_view(other)
        assert not view["settled"], view
        for p in suspect.partitions:
            entry = view["partitions"][suspect.store.topic][str(p)]
            assert entry["active"] is None and entry["suspect"] == suspect.url, entry
    still_suspected(suspect)


@then(
    "the others answer a read of each of its keys with 503 and Retry-After, never a redirect to it"
)
def reads_unavailable(suspect: Suspect) -> None:
    assert suspect.store is not None and suspect.keys
    for other in suspect.others:
        for key in suspect.keys:
            status, headers, body = request(other.url + suspect.store.path(key))
            assert status == 503 and headers["Retry-After"].isdigit(), (status, body)
            assert "is a suspect" in body["error"], body
    still_suspected(suspect)


@then(
    parsers.parse(
        "the others answer a read of each of its keys with max_lag {lag:d} from a standby copy"
    )
)
def reads_from_standbys(suspect: Suspect, lag: int) -> None:
    assert suspect.store is not None
    ids = member_ids(cluster_view(suspect.others[0]))
    for other in suspect.others:
        for key in suspect.keys:
            status, body = http("GET", f"{other.url}{suspect.store.path(key)}?max_lag={lag}")
            assert status == 200, body
            assert body["value"] == _value(key), body
            served = body["served_by"]
            assert served["role"] == "standby" and served["instance"] != ids[suspect.url], body
    still_suspected(suspect)


@then("the others answer a command to each of its products with 503 and Retry-After")
def commands_unavailable(suspect: Suspect) -> None:
    for other in suspect.others:
        for key in suspect.keys:
            url = f"{other.url}/commands/product/{key}/receive_shipment"
            status, headers, body = request(url, b'{"quantity": 1}')
            assert status == 503 and headers["Retry-After"].isdigit(), (status, body)
    still_suspected(suspect)


@then("foldstream status, asked of another instance, shows it as a suspect and exits 1")
def status_shows_it(suspect: Suspect) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foldstream", "status", suspect.others[0].url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    name = member_ids(cluster_view(suspect.others[0]))[suspect.url]
    assert f"{name} (suspect)" in done.stdout, done.stdout
    assert f"none: {name} is a suspect" in done.stdout, done.stdout
    still_suspected(suspect)


@then(
    parsers.parse(
        "a smart client reads each of its keys with max_lag {lag:d} without sending it a request"
    )
)
def client_avoids_it(suspect: Suspect, lag: int) -> None:
    sent: list[str] = []
    hooks = {"request": [lambda r: sent.append(str(r.url))]}
    with (
        httpx.Client(timeout=10, event_hooks=hooks) as client_http,
        FoldstreamClient(suspect.others[0].url, http=client_http, retry_timeout=10) as client,
    ):
        for key in suspect.keys:
            answer = client.lookup("stock", key, max_lag=lag)
            assert answer.value == _value(key), answer
            assert answer.served_by.role == "standby", answer
        assert any(m.suspect for m in client.cluster().instances)
    port = urlsplit(suspect.url).port
    assert sent and all(urlsplit(url).port != port for url in sent), sent
    still_suspected(suspect)


@then("the dashboard of another instance shows it as a suspect")
def dashboard_shows_it(suspect: Suspect, page: Page) -> None:
    name = member_ids(cluster_view(suspect.others[0]))[suspect.url]
    page.wait_for("document.querySelectorAll('#members .suspect').length === 1")
    rows = page.evaluate(
        "[...document.querySelectorAll('#members tbody tr')].filter(r => "
        "r.querySelector('.suspect')).map(r => r.children[0].textContent)"
    )
    assert rows == [name], rows
    cells = page.evaluate(
        "[...document.querySelectorAll('table.partition-map tr[data-partition]')]"
        ".filter(r => r.children[1].querySelector('.suspect'))"
        ".map(r => [r.closest('table').dataset.topic, Number(r.dataset.partition), "
        "r.children[1].textContent])"
    )
    assert suspect.store is not None
    shown = sorted(p for topic, p, _ in cells if topic == suspect.store.topic)
    assert shown == sorted(suspect.partitions), cells
    assert all(text == f"{name} (suspect)" for _, _, text in cells), cells
    assert "suspect" in page.evaluate("document.querySelector('#summary').textContent")
    still_suspected(suspect)


@when("it resumes")
def resumes(suspect: Suspect) -> None:
    suspect.resume()


@then("no instance suspects it any more")
def not_suspected(suspect: Suspect) -> None:
    wait_until(
        lambda: all(suspected_by(o, suspect.url) is False for o in suspect.others),
        lambda: json.dumps([cluster_view(o)["instances"] for o in suspect.others]),
    )
