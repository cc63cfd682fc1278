"""The cluster map's view keeps moving whatever one member leaves behind on the cluster topic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.cluster.assignment import Assignment
from foldstream.cluster.map import ASSIGNMENT_KEY, ClusterMap
from foldstream.cluster.records import MemberState
from foldstream.kafka_topics import TopicSpec, ensure_topics
from foldstream.testing.scenario import wait_until


@pytest.fixture
def cluster_topic(tmp_path: Path, broker: KafkaCluster) -> str:
    topic = f"map-{tmp_path.name}.cluster"
    ensure_topics(broker.bootstrap, [TopicSpec(topic, 1, compact=True)])
    return topic


@pytest.fixture
def watcher(cluster_topic: str, broker: KafkaCluster) -> Iterator[ClusterMap]:
    cluster_map = ClusterMap(
        bootstrap=broker.bootstrap, topic=cluster_topic, member_id="m-b", liveness_s=1.0
    )
    cluster_map.start()
    yield cluster_map
    cluster_map.close()


def _state(member_id: str) -> MemberState:
    return MemberState(id=member_id, url=f"http://127.0.0.1:1/{member_id}")


def test_a_leader_stopped_inside_its_transaction_drops_out_and_later_records_are_read(
    watcher: ClusterMap, cluster_topic: str, broker: KafkaCluster
) -> None:
    """A leader paused or killed between producing an assignment and committing it leaves an
    open transaction; the other members still read past it, see the leader fall silent and
    see the members that publish after it."""
    heartbeats = Producer({"bootstrap.servers": broker.bootstrap})
    heartbeats.produce(cluster_topic, key=b"m-a", value=_state("m-a").to_json())
    heartbeats.flush(10)
    leader = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "map-leader"})
    leader.init_transactions(10)
    leader.begin_transaction()
    planned = Assignment(1, "m-a", {"events": {"0": "m-a"}}, members=["m-a", "m-b"])
    leader.produce(cluster_topic, key=ASSIGNMENT_KEY, value=planned.to_json())
    leader.flush(10)  # appended, never committed: the leader stands still from here
    heartbeats.produce(cluster_topic, key=b"m-c", value=_state("m-c").to_json())
    heartbeats.flush(10)

    def view() -> set[str]:
        watcher.publish(_state("m-b"))  # its beats read back move its view on
        heartbeats.produce(cluster_topic, key=b"m-c", value=_state("m-c").to_json())
        heartbeats.poll(0)
        return set(watcher.members())

    wait_until(lambda: "m-c" in view(), lambda: f"m-c never seen: {view()}", timeout=30)
    wait_until(lambda: view() == {"m-b", "m-c"}, lambda: f"m-a never dropped: {view()}", timeout=30)
    # Read uncommitted: the open transaction's assignment is read too, and a newer leader's
    # next generation supersedes it.
    assert watcher.assignment().generation == 1


def test_the_view_is_current_only_while_a_beat_sent_within_the_liveness_was_read_back(
    watcher: ClusterMap,
) -> None:
    """After this process stood still for ``liveness_s`` (no beat read back since), an
    assignment that gave its partitions away may be unread: its handover claims nothing then."""
    assert not watcher.view_is_current()  # nothing read back yet
    _beat_until_current(watcher)
    wait_until(lambda: not watcher.view_is_current(), lambda: "the view stayed current", 10)
    _beat_until_current(watcher)


def _beat_until_current(watcher: ClusterMap) -> None:
    """Beat as the heartbeat does (the first beats take a while: the producer connects)."""

    def beat_read_back() -> bool:
        watcher.publish(_state("m-b"))
        return watcher.view_is_current()

    wait_until(beat_read_back, lambda: "no beat was read back within the liveness", 10)


@pytest.fixture
def suspicious(cluster_topic: str, broker: KafkaCluster) -> Iterator[tuple[ClusterMap, list[int]]]:
    """A map whose members are suspects after 1 s of silence and dead after 3 s, and the
    number of times it told its listener the view changed (a one-item list)."""
    told = [0]

    def changed() -> None:
        told[0] += 1

    cluster_map = ClusterMap(
        bootstrap=broker.bootstrap,
        topic=cluster_topic,
        member_id="m-b",
        liveness_s=3.0,
        suspect_s=1.0,
        on_change=changed,
    )
    cluster_map.start()
    yield cluster_map, told
    cluster_map.close()


def test_a_member_whose_beats_are_late_is_a_suspect_until_it_beats_again_or_drops_out(
    suspicious: tuple[ClusterMap, list[int]], cluster_topic: str, broker: KafkaCluster
) -> None:
    """Silent for ``suspect_s`` (in the watcher's view), a member is a suspect: still a member,
    and the listener is told without any record read; it clears at its next beat, and drops
    out after ``liveness_s``."""
    watcher, told = suspicious
    other = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})

    def beat(*, other_beats: bool) -> ClusterMap:
        watcher.publish(_state("m-b"))  # its own beats read back move its view on
        if other_beats:
            other.produce(cluster_topic, key=b"m-a", value=_state("m-a").to_json())
            other.poll(0)
        time.sleep(0.1)
        return watcher

    def standing() -> tuple[bool, bool]:
        return "m-a" in watcher.members(), "m-a" in watcher.suspects()

    wait_until(lambda: beat(other_beats=True) and standing() == (True, False), standing, 30)
    wait_until(lambda: beat(other_beats=False) and standing() == (True, True), standing, 10)
    assert {m["id"]: m["suspect"] for m in watcher.snapshot()["instances"]} == {
        "m-a": True,
        "m-b": False,
    }
    told_at_suspicion = told[0]
    wait_until(lambda: beat(other_beats=True) and standing() == (True, False), standing, 10)
    assert told[0] > told_at_suspicion  # cleared: told
    wait_until(lambda: beat(other_beats=False) and standing() == (True, True), standing, 10)
    told_at_suspicion = told[0]
    wait_until(lambda: beat(other_beats=False) and standing() == (False, False), standing, 10)
    assert told[0] > told_at_suspicion  # dropped out without any record of it read: told
    assert watcher.suspicion.suspicions == 2


def test_a_watcher_that_stands_still_suspects_nobody(
    suspicious: tuple[ClusterMap, list[int]], cluster_topic: str, broker: KafkaCluster
) -> None:
    """Silence is measured against the watcher's own view: while its own beats are not read
    back (it stands still, its broker is slow), the others' silence does not grow."""
    watcher, _ = suspicious
    other = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})

    def both_beat() -> bool:
        watcher.publish(_state("m-b"))
        other.produce(cluster_topic, key=b"m-a", value=_state("m-a").to_json())
        other.flush(10)
        time.sleep(0.1)
        return "m-a" in watcher.members() and watcher.view_is_current()

    wait_until(both_beat, lambda: f"members {watcher.members()}", 30)
    time.sleep(2.5)  # neither beats: the time that would make m-a a suspect by the wall clock
    assert "m-a" in watcher.members() and watcher.suspects() == frozenset()
