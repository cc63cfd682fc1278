"""Exactly once across two stages, on real parts without Spark: the charts example's
``song_plays`` folded into RocksDB and forwarding its changes to the broker's repartition topic
(stage 1), the records read back and folded into ``top5`` (stage 2), with the failures that
make forwarding at-least-once: a task that crashes after sending and before committing, a
paused former owner (a zombie) sending late, a send lost before later ones of its task, and a
stage-2 task that crashes before committing. ``top5`` must equal the charts computed from
``song_plays``' final values, every time."""

from __future__ import annotations

import json
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster
from foldstream.domain import EventCodec
from foldstream.domain.records import EventRecord
from foldstream.examples.charts import TOP, Song
from foldstream.kafka import TopicSpec, ensure_topics, partition_for, producer_config
from foldstream.projections.chunks import Records
from foldstream.projections.forwarded import RESERVED, parse_forwarded
from foldstream.projections.graph import forwards_option
from foldstream.projections.joins import InputFailed, repartition_topic
from foldstream.projections.staged import Staging
from foldstream.projections.task_output import await_changelog
from foldstream.service import Service, load_service
from foldstream.state import RocksDBWriter
from foldstream.testing.kafka import read_topic

REPARTITIONS = 2
SERVICE: Service = load_service("foldstream.examples.charts:service")


@pytest.fixture
def events_topic(broker: KafkaCluster) -> str:
    """A fresh events topic name, and its ``top5`` repartition topic on the broker."""
    events = f"charts-{uuid.uuid4().hex[:8]}.events"
    ensure_topics(broker.bootstrap, [TopicSpec(repartition_topic(events, "top5"), REPARTITIONS)])
    return events


@pytest.fixture
def producer(broker: KafkaCluster) -> Iterator[Producer]:
    producer = Producer(producer_config(broker.bootstrap))
    yield producer
    producer.flush(10)


def song_events(songs: int, plays: int, seed: int) -> Records:
    """``songs`` songs of two genres registered, then ``plays`` plays of random songs, as one
    partition's records from offset 0."""
    rng, codec = random.Random(seed), EventCodec([Song])
    catalogue = [Song(id=f"s{n:02d}") for n in range(songs)]
    records: list[EventRecord] = []
    for n, song in enumerate(catalogue):
        song.register(f"title {n}", "artist", ["rock", "jazz"][n % 2])
        records += [codec.encode(e) for e in song.collect_events()]
    for _ in range(plays):
        song = rng.choice(catalogue)
        song.play()
        records += [codec.encode(e) for e in song.collect_events()]
    return list(enumerate(records))


def stage_one(
    path: Path, events_topic: str, records: Records, producer: Producer, *, commit: bool
) -> None:
    """A ``song_plays`` task of partition 0 folding ``records`` from its committed state at
    ``path``: its forwarded records sent and acknowledged, then committed unless ``commit`` is
    false (the task crashed after sending)."""
    song_plays = SERVICE.projection("song_plays")
    layout = {repartition_topic(events_topic, "top5"): REPARTITIONS}
    options = {
        "forwards": forwards_option(SERVICE.projections, "song_plays", events_topic, layout),
        "topic": events_topic,
    }
    staging = Staging.of(options, song_plays, SERVICE.projections, producer)
    assert staging is not None
    writer = RocksDBWriter(path, identity=f"{events_topic}/0")
    try:
        folded = staging.stage(0).fold(writer, records, None, None)
        assert folded is not None and folded.last_offset is not None
        await_changelog([folded])
        if commit:
            writer.commit(folded.last_offset)
    finally:
        writer.close()


def forwarded_records(bootstrap: str, events_topic: str) -> dict[int, list[EventRecord]]:
    """What the repartition topic holds, by partition, in order."""
    found: dict[int, list[EventRecord]] = {r: [] for r in range(REPARTITIONS)}
    topic = repartition_topic(events_topic, "top5")
    for partition, _, key, value, headers in read_topic(bootstrap, topic, REPARTITIONS):
        found[partition].append(EventRecord(key, value, tuple(headers)))
    return found


def stage_two(path: Path, partition: int, delivered: list[EventRecord], seed: int) -> None:
    """``top5``'s partition ``partition`` folding ``delivered`` (as its topic's records from
    offset 0) in chunks of random sizes, one of them folded, then lost (the task crashed before
    committing) and folded again."""
    rng = random.Random(seed)
    top5 = SERVICE.projection("top5")
    staging = Staging.of({"topic": "top5 source"}, top5, SERVICE.projections, None)
    assert staging is not None
    records = list(enumerate(delivered))
    start, crashed = 0, False
    while start < len(records):
        end = start + rng.randint(1, 6)
        writer = RocksDBWriter(path, identity=f"top5/{partition}")
        try:
            folded = staging.stage(partition).fold(writer, records[start:end], None, None)
            assert folded is not None and folded.last_offset is not None
            if not crashed and rng.random() < 0.3:
                crashed = True  # nothing committed: the chunk comes again
                continue
            writer.commit(folded.last_offset)
            start = end
        finally:
            writer.close()


def served(paths: list[Path]) -> dict[str, Any]:
    """The values of every partition at ``paths``, reserved keys left out."""
    values: dict[str, Any] = {}
    for path in paths:  # named top5-<partition>
        writer = RocksDBWriter(path, identity=path.name.replace("-", "/"))
        try:
            for key, value in writer._db.items():
                if isinstance(key, bytes) and not key.startswith(RESERVED):
                    values[key.decode()] = json.loads(value)
        finally:
            writer.close()
    return values


def charts(records: Records) -> dict[str, Any]:
    """The top 5 of each genre, computed plainly from the events."""
    songs: dict[str, dict[str, Any]] = {}
    codec = EventCodec([Song])
    for _, record in records:
        event = codec.decode(record)
        if isinstance(event, Song.Registered):
            songs[event.originator_id] = {"title": event.title, "genre": event.genre, "plays": 0}
        elif isinstance(event, Song.Played):
            songs[event.originator_id]["plays"] += 1
    result = {}
    for genre in {s["genre"] for s in songs.values()}:
        entries = [
            {"song": song, "title": s["title"], "plays": s["plays"]}
            for song, s in songs.items()
            if s["genre"] == genre
        ]
        entries.sort(key=lambda e: (-e["plays"], e["song"]))
        result[genre] = {"genre": genre, "top": entries[:TOP]}
    return result


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_crashes_and_a_zombie_apply_every_change_once(
    broker: KafkaCluster, events_topic: str, producer: Producer, tmp_path: Path, seed: int
) -> None:
    records = song_events(songs=9, plays=60, seed=seed)
    owner, zombie = tmp_path / "owner", tmp_path / "zombie"
    first, crash_at, zombie_to = 15, 40, 55
    stage_one(owner, events_topic, records[:first], producer, commit=True)
    shutil.copytree(owner, zombie)  # the former owner, paused after its commit
    stage_one(owner, events_topic, records[first:crash_at], producer, commit=False)
    for start in range(first, len(records), 10):  # the retry, from the committed offset
        stage_one(owner, events_topic, records[start : start + 10], producer, commit=True)
    stage_one(zombie, events_topic, records[first:zombie_to], producer, commit=True)

    forwarded = forwarded_records(broker.bootstrap, events_topic)
    assert sum(map(len, forwarded.values())) > len(records), "no duplicates were sent"
    paths = [tmp_path / f"top5-{r}" for r in range(REPARTITIONS)]
    for partition, delivered in forwarded.items():
        stage_two(paths[partition], partition, delivered, seed)
    assert served(paths) == charts(records)


@pytest.mark.parametrize("seed", [4, 5])
def test_records_after_a_lost_send_wait_for_it(
    broker: KafkaCluster, events_topic: str, producer: Producer, tmp_path: Path, seed: int
) -> None:
    """A send lost in the middle of a task's sends (its task then fails, and its retry sends
    it and those after it again): the records after the gap are skipped, then applied once in
    the retry's order; whole sequences delivered again are skipped."""
    records = song_events(songs=7, plays=40, seed=seed)
    stage_one(tmp_path / "owner", events_topic, records, producer, commit=True)
    forwarded = forwarded_records(broker.bootstrap, events_topic)
    rng = random.Random(seed)
    paths = [tmp_path / f"top5-{r}" for r in range(REPARTITIONS)]
    assert any(len(sent) > 2 for sent in forwarded.values())
    for partition, sent in forwarded.items():
        if len(sent) < 3:
            continue
        lost = rng.randrange(1, len(sent) - 1)
        retry_from = rng.randrange(0, lost + 1)
        delivered = [*sent[:lost], *sent[lost + 1 :], *sent[retry_from:], *sent[:lost]]
        stage_two(paths[partition], partition, delivered, seed)
    expected = charts(records)
    assert served([p for p in paths if p.exists()]) == {
        genre: chart for genre, chart in expected.items() if len(forwarded[partition_of(genre)]) > 2
    }


def partition_of(key: str) -> int:
    return partition_for(key.encode(), REPARTITIONS)


def test_forwarded_records_name_their_origin(
    broker: KafkaCluster, events_topic: str, producer: Producer, tmp_path: Path
) -> None:
    records = song_events(songs=3, plays=5, seed=0)
    stage_one(tmp_path / "owner", events_topic, records, producer, commit=True)
    for partition, sent in forwarded_records(broker.bootstrap, events_topic).items():
        positions = []
        for record in sent:
            forwarded = parse_forwarded(record)
            assert forwarded.origin == ("song_plays", events_topic, 0)
            positions.append(forwarded.position)
            assert forwarded.prev == (positions[-2] if len(positions) > 1 else None), partition
        assert positions == sorted(positions)


def test_a_rekey_function_that_raises_names_store_topic_partition_and_offset(
    broker: KafkaCluster, producer: Producer
) -> None:
    from foldstream.projections import Events, Join
    from foldstream.projections.emit import Emitter, targets_of

    def broken_key(event: Any) -> str:
        raise KeyError("no genre")

    service = Service(
        "broken",
        aggregates={"song": Song},
        projections=[Join("by_genre", [Events(lambda s, e: s, key=broken_key)])],
    )
    forwarder = service.projections[0]
    option = forwards_option(
        service.projections, forwarder.store, "broken.events", {"broken.by_genre.repartition": 1}
    )
    targets = targets_of(service.projections, forwarder.store, option)
    emitter = Emitter(forwarder.store, "broken.events", 2, targets)
    song = Song(id="s1")
    song.register("t", "a", "rock")
    record = EventCodec([Song]).encode(song.collect_events()[0])
    with pytest.raises(InputFailed) as raised:
        emitter.events(record, 17)
    message = str(raised.value)
    assert "'by_genre'" in message and "broken.events partition 2 offset 17" in message, message
    assert "KeyError" in message, message
