"""Commands retried with their Idempotency-Key after a ``kill -9`` of the instance that owned
their partition: the other instance, once it took the partition over, answers each command
the first attempt applied with that attempt's events, position and token, runs the ones it
never applied, and nothing is appended twice. Every unknown outcome becomes a known one. A real
cluster of 2 instances of the inventory example (real broker, Spark, RocksDB and HTTP)."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest

from foldstream.broker import KafkaCluster
from foldstream.client import FoldstreamClient
from foldstream.commands.http import REPLAYED_HEADER
from foldstream.commands.idempotency import HEADER
from foldstream.kafka import partition_for
from foldstream.process import InstanceProcess
from foldstream.testing.kafka import read_topic
from foldstream.testing.plugin import InstancePool

SERVICE = "foldstream.examples.inventory:service"
TOPIC = "inventory.events"
#: How long a retry is sent again while the survivor takes the partitions over.
RETRY_S = 120.0


@pytest.fixture(scope="module")
def cluster(instances: InstancePool) -> list[InstanceProcess]:
    return instances.cluster(SERVICE, 2)


@dataclass
class Sent:
    """A keyed command sent to the owner before and while it was killed."""

    product: str
    quantity: int
    key: str
    first: httpx.Response | None = None  # None: no answer (the owner died meanwhile)


def owned_by(member: InstanceProcess, partitions: int) -> list[str]:
    """Product ids whose partitions ``member`` owns, one per partition."""
    view = httpx.get(f"{member.url}/cluster", timeout=10).json()
    mine = [int(p) for p, o in view["partitions"][TOPIC].items() if o["active"] == member.url]
    assert mine, view
    ids = (f"idem-{n}" for n in itertools.count())
    return [next(i for i in ids if partition_for(i.encode(), partitions) == p) for p in mine]


def send_until_killed(
    url: str, products: list[str], sent: list[Sent], killed: threading.Event
) -> None:
    """Keyed commands, one after another, until the owner is killed (the last one then has no
    answer)."""
    quantities = itertools.count(len(sent) * 1000 + 1)
    with httpx.Client(timeout=10) as http:
        while not killed.is_set():
            one = Sent(products[len(sent) % len(products)], next(quantities), str(uuid.uuid4()))
            sent.append(one)
            try:
                one.first = http.post(
                    f"{url}/commands/product/{one.product}/receive_shipment",
                    json={"quantity": one.quantity},
                    headers={"Idempotency-Key": one.key},
                )
            except httpx.HTTPError:
                return


def retried(url: str, one: Sent) -> httpx.Response:
    """The command sent again with its key until a definite answer (not a 503; a 307 to the
    dead owner is sent again here: the survivor takes its partitions)."""
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            answer = httpx.post(
                f"{url}/commands/product/{one.product}/receive_shipment",
                json={"quantity": one.quantity},
                headers={"Idempotency-Key": one.key},
                timeout=10,
            )
            if answer.status_code not in (307, 503):
                return answer
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"no definite answer for {one} in {RETRY_S}s"
        time.sleep(0.5)


def test_retries_after_a_kill_9_of_the_owner_answer_the_first_outcome_and_append_nothing_more(
    cluster: list[InstanceProcess], broker: KafkaCluster
) -> None:
    owner, survivor = cluster
    products = owned_by(owner, owner.partitions)
    sent: list[Sent] = []
    killed = threading.Event()
    senders = [
        threading.Thread(target=send_until_killed, args=(owner.url, products, sent, killed))
        for _ in range(3)
    ]
    for sender in senders:
        sender.start()
    while sum(1 for s in sent if s.first is not None and s.first.status_code == 200) < 10:
        time.sleep(0.01)
    owner.kill()  # SIGKILL: the snapshots and keys of its last commands may be unwritten
    killed.set()
    for sender in senders:
        sender.join(60)

    unknown = [s for s in sent if s.first is None]
    answered = [s for s in sent if s.first is not None]
    assert answered and all(s.first.status_code == 200 for s in answered if s.first)
    for one in sent:
        again = retried(survivor.url, one)
        assert again.status_code == 200, again.text
        if one.first is not None:  # the same events, position and token, nothing appended
            assert again.content == one.first.content
            assert again.headers[REPLAYED_HEADER] == "true"
    reused = answered[0]
    assert reused.first is not None
    other = httpx.post(
        f"{survivor.url}/commands/product/{reused.product}/receive_shipment",
        json={"quantity": reused.quantity + 1},
        headers={"Idempotency-Key": reused.key},
        timeout=10,
    )
    assert other.status_code == 422 and other.json()["idempotency_key"] == reused.key
    with FoldstreamClient([survivor.url]) as client:  # the client sends its key alike
        through_client = client.command(
            "product",
            reused.product,
            "receive_shipment",
            {"quantity": reused.quantity},
            idempotency_key=reused.key,
        )
    first = reused.first.json()
    offset, token = through_client.position.offset, through_client.token
    assert (offset, token) == (first["position"]["offset"], first["token"])
    assert unknown, "the kill left no command without an answer: nothing unknown was retried"

    in_log: dict[str, list[int]] = {}
    for _, _, _, value, headers in read_topic(broker.bootstrap, TOPIC, owner.partitions):
        named = dict(headers)
        if HEADER in named and b"ShipmentReceived" in named["event-type"]:
            key = json.loads(named[HEADER])["key"]
            in_log.setdefault(key, []).append(json.loads(value or b"{}")["quantity"])
    assert {s.key: in_log.get(s.key) for s in sent} == {s.key: [s.quantity] for s in sent}
