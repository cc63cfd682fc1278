"""Local copies whose topics changed under them (created again, a broker that came back empty)
are found before they are used, and rebuilt or refused: the decision alone, then on a real
broker, restores, standby copies and the startup check."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from foldstream.broker import KafkaCluster, free_port
from foldstream.changelog import (
    BATCH_END_HEADER,
    EPOCH_HEADER,
    FOLDED_FROM_HEADER,
    SOURCE_ID_HEADER,
    SOURCE_OFFSET_HEADER,
    StandbyReplicas,
    StoreLayout,
    open_copy,
    restore,
)
from foldstream.end_probes import positions_within
from foldstream.errors import StaleState
from foldstream.kafka import TopicSpec, ensure_topics, producer_config, topic_ids
from foldstream.settings import OnStaleState
from foldstream.stale_state import check_local_copies
from foldstream.state.validity import Observed, Recorded, judge
from foldstream.testing.kafka import create_again

# -- the decision ---------------------------------------------------------------------------


def _judge(recorded: Recorded, observed: Observed) -> tuple[str, bool] | None:
    verdict = judge(recorded, observed, source="s.events", changelog="s.changelog", partition=3)
    return None if verdict is None else (str(verdict), verdict.changelog_whole)


def test_a_copy_that_recorded_nothing_belongs_to_any_topics() -> None:
    assert _judge(Recorded(source_id="A", changelog_id="B"), Observed("X", "Y", False)) is None


def test_a_copy_within_the_topics_it_was_built_from_is_used() -> None:
    assert _judge(Recorded(5, 9, "A", "B"), Observed("A", "B")) is None


def test_unknown_ids_are_no_evidence_either_way() -> None:
    # Not stamped (an earlier foldstream), or a broker that keeps no ids: offsets decide.
    assert _judge(Recorded(5, 9, None, "B"), Observed("A", None)) is None
    reasons, whole = _judge(Recorded(5, 9), Observed(None, None, False, True)) or ("", True)
    assert reasons == "s.events/3 ends before offset 5, which the copy had read"
    assert not whole  # the source moved on without the changelog: it holds the old values


def test_a_source_created_again_leaves_the_changelog_of_the_old_one_not_whole() -> None:
    reasons, whole = _judge(Recorded(5, 9, "A", "B"), Observed("A2", "B")) or ("", True)
    assert "topic s.events is not the one the copy was built from (its id was A" in reasons
    assert not whole


def test_a_changelog_created_again_is_whole_for_what_it_holds() -> None:
    for observed in (Observed("A2", "B2"), Observed("A", "B2"), Observed("A", "B", True, False)):
        verdict = _judge(Recorded(5, 9, "A", "B"), observed)
        assert verdict is not None and verdict[1], observed


# -- on a real broker -------------------------------------------------------------------------


def _topics(broker: KafkaCluster, partitions: int = 1) -> StoreLayout:
    name = f"stale-{uuid.uuid4().hex[:8]}"
    layout = StoreLayout(f"{name}.events", f"{name}.changelog")
    ensure_topics(broker.bootstrap, _specs(layout, partitions))
    return layout


def _specs(layout: StoreLayout, partitions: int) -> list[TopicSpec]:
    return [
        TopicSpec(layout.source_topic, partitions),
        TopicSpec(layout.changelog_topic, partitions, compact=True),
    ]


def _produce(broker: KafkaCluster, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer(producer_config(broker.bootstrap))
    for n in range(count):
        producer.produce(topic, key=b"k%d" % n, value=b"v", partition=partition)
    assert producer.flush(30) == 0


def _batch(
    broker: KafkaCluster,
    layout: StoreLayout,
    values: dict[bytes, bytes],
    *,
    source_offset: int,
    marked: bool = True,
    partition: int = 0,
) -> None:
    """One whole projection batch in the changelog, marked with the source topic's current id
    (or, ``marked=False``, as an earlier foldstream wrote it)."""
    headers = [
        (SOURCE_OFFSET_HEADER, str(source_offset).encode()),
        (FOLDED_FROM_HEADER, b"-1"),
        (EPOCH_HEADER, b"1"),
    ]
    if marked:
        source_id = topic_ids(broker.bootstrap, [layout.source_topic])[layout.source_topic]
        assert source_id is not None
        headers.append((SOURCE_ID_HEADER, source_id.encode()))
    producer = Producer(producer_config(broker.bootstrap))
    last = list(values)[-1]
    for key, value in values.items():
        end = [(BATCH_END_HEADER, b"1")] if key == last else []
        producer.produce(
            layout.changelog_topic, key=key, value=value, partition=partition, headers=headers + end
        )
    assert producer.flush(30) == 0


def _restore(broker: KafkaCluster, state_dir: Path, layout: StoreLayout, p: int = 0) -> int:
    return restore(
        bootstrap=broker.bootstrap, state_dir=state_dir, store="s", layout=layout, partition=p
    )


def _copy(
    state_dir: Path, layout: StoreLayout, p: int = 0
) -> tuple[dict[bytes, bytes | None], int | None]:
    """The copy's values of keys a, b and c, and its last source offset."""
    writer = open_copy(state_dir, "s", layout, p)
    try:
        return {k: writer.get(k) for k in (b"a", b"b", b"c")}, writer.applied_offset()
    finally:
        writer.close()


def _discarded(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "foldstream.stale_state" and r.levelno == logging.WARNING
    ]


def _built(broker: KafkaCluster, tmp_path: Path, layout: StoreLayout) -> None:
    """A copy of ``layout``'s partition 0 restored from a batch folded from source offset 2."""
    _produce(broker, layout.source_topic, 3)
    _batch(broker, layout, {b"a": b"a@2", b"b": b"b@2"}, source_offset=2)
    assert _restore(broker, tmp_path, layout) == 2


def _outlived(broker: KafkaCluster, tmp_path: Path) -> StoreLayout:
    """Topics whose copy (:func:`_built`) outlived them: both deleted and created again."""
    layout = _topics(broker)
    _built(broker, tmp_path, layout)
    create_again(broker.bootstrap, _specs(layout, 1))
    return layout


def test_positions_past_a_partitions_end_are_told_from_those_within(
    broker: KafkaCluster,
) -> None:
    layout = _topics(broker, partitions=2)
    _produce(broker, layout.source_topic, 5)  # partition 0 holds offsets 0..4, 1 is empty
    topic = layout.source_topic
    asked = {(topic, 0): 3, (topic, 1): 0, (layout.changelog_topic, 0): 1}
    assert positions_within(broker.bootstrap, asked) == {
        (topic, 0): True,
        (topic, 1): True,
        (layout.changelog_topic, 0): False,
    }
    assert positions_within(broker.bootstrap, {(topic, 0): 5, (topic, 1): 1}) == {
        (topic, 0): True,  # the end itself: the next offset to be written
        (topic, 1): False,
    }
    assert positions_within(broker.bootstrap, {(topic, 0): 6}) == {(topic, 0): False}


def test_a_position_in_an_open_transaction_lies_within(broker: KafkaCluster) -> None:
    """The log reaches a position past the last stable offset, up to the high watermark: a copy
    recorded there is not past the end of its topic (which would discard it)."""
    layout = _topics(broker)
    topic = layout.source_topic
    _produce(broker, topic, 2)
    writer = Producer(
        producer_config(broker.bootstrap, **{"transactional.id": f"stale-{uuid.uuid4().hex}"})
    )
    writer.init_transactions(30)
    writer.begin_transaction()
    for n in range(3):
        writer.produce(topic, key=b"open", value=b"%d" % n, partition=0)
    assert writer.flush(30) == 0  # offsets 2-4, not committed: the last stable offset is 2
    try:
        assert positions_within(broker.bootstrap, {(topic, 0): 5}) == {(topic, 0): True}
        assert positions_within(broker.bootstrap, {(topic, 0): 6}) == {(topic, 0): False}
    finally:
        writer.abort_transaction(30)


def test_a_topic_created_again_has_another_id(broker: KafkaCluster) -> None:
    layout = _topics(broker)
    before = topic_ids(broker.bootstrap, [layout.source_topic, "stale-no-such-topic"])
    assert list(before) == [layout.source_topic] and before[layout.source_topic]
    create_again(broker.bootstrap, _specs(layout, 1)[:1])
    assert topic_ids(broker.bootstrap, [layout.source_topic]) != before


def test_a_copy_of_topics_created_again_is_rebuilt_from_the_new_ones(
    broker: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layout = _outlived(broker, tmp_path)
    _produce(broker, layout.source_topic, 1)
    _batch(broker, layout, {b"c": b"c@0"}, source_offset=0)
    with caplog.at_level(logging.INFO):
        assert _restore(broker, tmp_path, layout) == 1
    assert _copy(tmp_path, layout) == ({b"a": None, b"b": None, b"c": b"c@0"}, 0)
    [line] = _discarded(caplog)
    assert line.startswith("store 's' partition 0: discarding its local copy ")
    assert f"topic {layout.source_topic} is not the one the copy was built from" in line
    assert f"rebuilding it from {layout.changelog_topic}" in line


def test_refused_copies_stay_and_the_error_names_the_state_directory_and_the_fix(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _outlived(broker, tmp_path)
    refusing = StoreLayout(layout.source_topic, layout.changelog_topic, OnStaleState.refuse)
    with pytest.raises(StaleState) as refused:
        _restore(broker, tmp_path, refusing)
    message = str(refused.value)
    assert f"state directory {tmp_path} holds a copy of store 's' partition 0" in message
    assert f"Delete {tmp_path}" in message and "--on-stale-state rebuild" in message
    assert "\n" not in message
    assert _copy(tmp_path, layout) == ({b"a": b"a@2", b"b": b"b@2", b"c": None}, 2)


def test_a_changelog_that_outlived_its_source_topic_is_never_applied_again(
    broker: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layout = _topics(broker)
    _built(broker, tmp_path / "owner", layout)
    create_again(broker.bootstrap, _specs(layout, 1)[:1])  # the source only
    with caplog.at_level(logging.INFO):
        assert _restore(broker, tmp_path / "owner", layout) == 0
    [line] = _discarded(caplog)
    assert f"rebuilding it from {layout.source_topic} ({layout.changelog_topic} holds" in line
    assert _copy(tmp_path / "owner", layout) == ({b"a": None, b"b": None, b"c": None}, None)
    # The rebuild folds the new topic; a copy made from the changelog later takes only that.
    _batch(broker, layout, {b"c": b"c@0"}, source_offset=0)
    assert _restore(broker, tmp_path / "fresh", layout) == 1
    assert _copy(tmp_path / "fresh", layout) == ({b"a": None, b"b": None, b"c": b"c@0"}, 0)


def test_old_changelog_records_that_do_not_say_their_source_topic_are_refused(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _topics(broker)
    _produce(broker, layout.source_topic, 3)
    _batch(broker, layout, {b"a": b"a@2"}, source_offset=2, marked=False)
    writer = open_copy(tmp_path, "s", layout, 0)  # as an earlier foldstream left it
    writer.write({b"a": b"a@2"}, 2, changelog_offset=0, changelog_epoch=1)
    writer.close()
    create_again(broker.bootstrap, _specs(layout, 1)[:1])
    with pytest.raises(StaleState) as refused:
        _restore(broker, tmp_path, layout)
    message = str(refused.value)
    assert f"{layout.changelog_topic}/0 holds values folded from an earlier" in message
    assert f"delete topic {layout.changelog_topic} and start them again" in message
    assert _copy(tmp_path, layout)[1] == 2  # nothing discarded: the operator decides


def test_a_copy_of_an_earlier_foldstream_ahead_of_empty_topics_is_rebuilt(
    broker: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A broker that came back empty: no ids stamped, the positions alone tell.
    layout = _topics(broker)
    writer = open_copy(tmp_path, "s", layout, 0)
    writer.write({b"a": b"a@7"}, 7, changelog_offset=3, changelog_epoch=2)
    writer.close()
    with caplog.at_level(logging.INFO):
        assert _restore(broker, tmp_path, layout) == 0
    [line] = _discarded(caplog)
    assert f"{layout.source_topic}/0 ends before offset 7" in line
    assert f"{layout.changelog_topic}/0 ends before offset 3" in line
    assert _copy(tmp_path, layout) == ({b"a": None, b"b": None, b"c": None}, None)


def test_a_standby_copy_of_topics_created_again_follows_the_new_changelog(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _outlived(broker, tmp_path)
    _batch(broker, layout, {b"c": b"c@0"}, source_offset=0)
    replicas = StandbyReplicas(
        bootstrap=broker.bootstrap, state_dir=tmp_path, layouts={"s": layout}
    )
    try:
        replicas.assign([("s", 0)])
        assert replicas.get("s", 0, b"a") is None
        deadline = time.monotonic() + 60
        while replicas.get("s", 0, b"c") != b"c@0":
            assert time.monotonic() < deadline, "the standby copy never applied the new batch"
            time.sleep(0.02)
    finally:
        replicas.close()


def test_the_startup_check_refuses_all_stale_copies_in_one_error_or_rebuilds_them(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _topics(broker, partitions=2)
    for p in (0, 1):
        _produce(broker, layout.source_topic, 2, partition=p)
        _batch(broker, layout, {b"a": b"a@1"}, source_offset=1, partition=p)
        assert _restore(broker, tmp_path, layout, p) == 1
    copies = [layout.local_copy(tmp_path, "s", p) for p in (0, 1, 2)]  # 2 does not exist
    assert check_local_copies(broker.bootstrap, copies, OnStaleState.refuse) == 0
    create_again(broker.bootstrap, _specs(layout, 2))
    with pytest.raises(StaleState, match=r"partition 0 \(and 1 more copies\) that does not"):
        check_local_copies(broker.bootstrap, copies, OnStaleState.refuse)
    assert all(c.path.exists() for c in copies[:2])
    assert check_local_copies(broker.bootstrap, copies, OnStaleState.rebuild) == 2
    assert not any(c.path.exists() for c in copies)


def test_the_startup_check_leaves_a_copy_held_open_elsewhere_to_its_next_open(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    layout = _outlived(broker, tmp_path)
    copy = layout.local_copy(tmp_path, "s", 0)
    holder = copy.open()  # e.g. an instance still stopping
    try:
        assert check_local_copies(broker.bootstrap, [copy], OnStaleState.refuse) == 0
    finally:
        holder.close()
    assert _restore(broker, tmp_path, layout) == 0  # checked (and rebuilt) here instead
    assert _copy(tmp_path, layout) == ({b"a": None, b"b": None, b"c": None}, None)


def test_serve_told_to_refuse_stops_before_serving_with_one_error_line(tmp_path: Path) -> None:
    """``foldstream serve --on-stale-state refuse`` on a state directory whose copy was built
    from other topics: one ``error:`` line naming the directory and the fix, exit status 2,
    before Spark or the HTTP server start."""
    state_dir = tmp_path / "state"
    layout = StoreLayout("inventory.events", "inventory.stock.changelog")
    writer = open_copy(state_dir, "stock", layout, 0)
    writer.write({b"sku-1": b'{"on_hand": 5}'}, 4, changelog_offset=1, changelog_epoch=1)
    writer.stamp_topic_ids("an-earlier-id", "another-earlier-id")
    writer.close()
    with KafkaCluster() as own:  # the inventory topics of the session broker stay untouched
        finished = subprocess.run(
            [sys.executable, "-m", "foldstream", "serve", "--port", str(free_port())]
            + ["--state-dir", str(state_dir), "--on-stale-state", "refuse"],
            env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": own.bootstrap},
            capture_output=True,
            text=True,
            timeout=120,
        )
    errors = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
    assert finished.returncode == 2, finished.stderr
    assert len(errors) == 1 and "Traceback" not in finished.stderr, finished.stderr
    assert errors[0].startswith(
        f"error: state directory {state_dir} holds a copy of store 'stock' partition 0 that "
        "does not belong to the topics it reads: topic inventory.events is not the one"
    )
    assert f"Delete {state_dir} to rebuild its stores" in errors[0]
    left = open_copy(state_dir, "stock", layout, 0)
    assert (left.applied_offset(), left.get(b"sku-1")) == (4, b'{"on_hand": 5}')  # as it was
    left.close()
