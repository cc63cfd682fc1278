"""The dashboard (/ui) and the API page (/docs) in headless Chromium, against a real 3-instance
cluster: members, the partition map as /cluster has it, a key lookup answered by another
instance, live projection figures, nothing loaded from outside the instance.

``FOLDSTREAM_UPDATE_SCREENSHOTS=1`` also saves the dashboard's screenshot as
``docs/img/dashboard.png`` (the one the docs show).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from foldstream.client import FoldstreamClient
from foldstream.process import InstanceProcess
from foldstream.testing.plugin import InstancePool
from tests.browser import Browser, Page

SERVICE = "foldstream.examples.inventory:service"
ROOT = Path(__file__).resolve().parents[1]
KEYS = [f"ui-sku-{n}" for n in range(12)]


@pytest.fixture(scope="module")
def cluster(instances: InstancePool) -> list[InstanceProcess]:
    members = instances.cluster(SERVICE, 3)
    with FoldstreamClient([m.url for m in members], retry_timeout=60) as client:
        for n, key in enumerate(KEYS):
            client.command("product", key, "receive_shipment", {"quantity": n + 1})
        deadline = time.monotonic() + 60
        while len(client.get_many("stock", KEYS).values) < len(KEYS):  # folded by now
            assert time.monotonic() < deadline, "the commands' events were not folded in 60 s"
            time.sleep(0.2)
    return members


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    browser = Browser()
    try:
        yield browser.new_page()
    finally:
        browser.close()


def keep_for_the_docs(page: Page, name: str) -> None:
    """Save the page as ``docs/img/<name>`` when ``FOLDSTREAM_UPDATE_SCREENSHOTS=1``."""
    if os.environ.get("FOLDSTREAM_UPDATE_SCREENSHOTS") == "1":
        page.screenshot(ROOT / "docs" / "img" / name)


def members_shown(page: Page) -> list[str]:
    return page.evaluate(  # type: ignore[no-any-return]
        "[...document.querySelectorAll('#members tbody tr td:first-child')]"
        ".map(td => td.textContent)"
    )


def test_the_dashboard_shows_the_cluster(
    page: Page, cluster: list[InstanceProcess], tmp_path: Path
) -> None:
    home = cluster[0].url
    with FoldstreamClient(home) as client:
        cluster_map = client.cluster()
        owners = {key: client.owners("stock", key).active for key in KEYS}
    page.goto(f"{home}/ui/")
    page.wait_for("document.querySelectorAll('#members tbody tr').length === 3")
    assert sorted(members_shown(page)) == sorted(m.id for m in cluster_map.instances)
    names = {m.url: m.id for m in cluster_map.instances}
    shown = page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('table.partition-map')].map(t => "
        "[t.dataset.topic, Object.fromEntries([...t.querySelectorAll('tr[data-partition]')]"
        ".map(r => [r.dataset.partition, r.children[1].textContent]))]))"
    )
    expected = {
        topic: {p: names.get(str(o.active), "none") for p, o in partitions.items()}
        for topic, partitions in cluster_map.partitions.items()
    }
    assert shown == expected
    standbys = page.evaluate("document.querySelectorAll('table.partition-map .standby').length")
    assert standbys >= 4  # each partition has a standby copy (the cluster fixture waits for it)

    # Live figures from this instance's /metrics: its projection has folded records.
    page.wait_for(
        "[...document.querySelectorAll('#figures tbody tr')].some(r => "
        "r.children[0].textContent === 'stock' && Number(r.children[1].textContent) > 0)"
    )

    # A key another instance owns: the lookup goes through this instance's api/lookup.
    elsewhere = next(key for key, owner in owners.items() if owner != home)
    page.evaluate(
        f"document.querySelector('#lookup-key').value = {json.dumps(elsewhere)};"
        "document.querySelector('#lookup button').click(); true"
    )
    page.wait_for("document.querySelector('#lookup-result').dataset.done")
    shown = page.evaluate("document.querySelector('#lookup-result').textContent")
    status, _, body = shown.partition("\n")
    answer = json.loads(body)
    assert status == "200", answer
    assert answer["value"] == {"on_hand": KEYS.index(elsewhere) + 1}
    assert answer["served_by"]["instance"] == names[str(owners[elsewhere])]

    shot = tmp_path / "dashboard.png"
    page.screenshot(shot)
    assert shot.stat().st_size > 10_000
    keep_for_the_docs(page, "dashboard.png")


def test_the_api_page_renders_the_services_openapi(
    page: Page, cluster: list[InstanceProcess]
) -> None:
    home = cluster[0].url
    page.goto(f"{home}/docs/")
    page.wait_for("document.querySelectorAll('.opblock').length >= 10")
    text = page.evaluate("document.body.innerText")
    assert "/commands/product/{id}/sell" in text and "/stores/stock/keys/{key}" in text
    keep_for_the_docs(page, "openapi.png")


def test_nothing_came_from_outside_the_instance_and_nothing_failed(
    page: Page, cluster: list[InstanceProcess]
) -> None:
    home = cluster[0].url
    requested = page.requested()
    assert any(url.startswith(f"{home}/ui/") for url in requested)
    outside = [u for u in requested if not u.startswith((home, "data:", "about:"))]
    assert outside == []
    assert page.errors() == []


def gauges_mismatch(cluster: list[InstanceProcess]) -> str | None:
    """How an instance's partition gauges differ from what it publishes, or None."""
    with FoldstreamClient(cluster[0].url) as client:
        members = {m.url: m for m in client.cluster().instances}
    for instance in cluster:
        member = members[instance.url]
        scraped = httpx.get(f"{instance.url}/metrics", timeout=10).text
        families = {f.name: f for f in text_string_to_metric_families(scraped)}
        roles = {
            (s.labels["role"], s.labels["topic"], int(s.labels["partition"]))
            for s in families["foldstream_partition_role"].samples
            if s.value == 1
        }
        published = {
            (role, topic, p)
            for role, by_topic in (("active", member.active), ("standby", member.standby))
            for topic, partitions in by_topic.items()
            for p in partitions
            if role == "active" or p not in member.active.get(topic, [])
        }
        lag = {
            f"{s.labels['store']}/{s.labels['partition']}": s.value
            for s in families["foldstream_partition_lag"].samples
        }
        if roles != published or lag != dict.fromkeys(member.lag, 0):
            return f"{instance.url}: roles {roles} vs {published}, lag {lag} vs {member.lag}"
    return None


def test_partition_gauges_match_the_cluster_map(cluster: list[InstanceProcess]) -> None:
    """``foldstream_partition_role`` and ``foldstream_partition_lag`` of each instance say what
    the instance publishes in the cluster map (settled and idle here: every copy caught up)."""
    deadline = time.monotonic() + 30
    while (mismatch := gauges_mismatch(cluster)) is not None:
        assert time.monotonic() < deadline, mismatch
        time.sleep(0.5)
