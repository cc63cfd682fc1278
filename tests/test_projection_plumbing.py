"""The pieces between Kafka and the fold: task planning, chunking, decoding."""

from __future__ import annotations

import subprocess
import sys

import pytest
from eventsourcing.persistence import StoredEvent

from foldstream.domain import EventCodec, EventRecord
from foldstream.examples.inventory.domain import Product
from foldstream.offsets import TailRecord
from foldstream.projections.chunks import Records, partition_chunks, records_of_planned
from foldstream.projections.query_failures import error_summary as _error_summary
from foldstream.projections.query_failures import restart_delay
from foldstream.projections.source import KafkaRange, plan_tasks
from foldstream.projections.task_output import changelog_position


def test_small_batches_are_one_task_and_large_ones_are_balanced() -> None:
    spans = [KafkaRange(p, 0, n) for p, n in enumerate([10, 0, 30, 20])]
    (single,) = plan_tasks(spans, tasks=2, single_task_records=100)
    assert [s.partition for s in single.spans] == [0, 2, 3]  # empty partitions are left out
    split = plan_tasks(spans, tasks=2, single_task_records=5)
    assert sorted(sum(s.size for s in t.spans) for t in split) == [30, 30]
    assert sorted(s.partition for t in split for s in t.spans) == [0, 2, 3]  # each once, whole
    assert plan_tasks([KafkaRange(0, 5, 5)], tasks=2, single_task_records=5) == []


def _batch(rows: list[tuple[int, int]]) -> dict[int, Records]:
    """A fetch of records at ``(partition, offset)``, in the order given."""
    found: dict[int, Records] = {}
    for p, o in rows:
        found.setdefault(p, []).append((o, EventRecord(b"k%d" % o, b"v", (("n", b"%d" % o),))))
    return found


def test_planned_records_become_records_by_partition() -> None:
    planned = (
        (1, (TailRecord(7, b"k7", b"v", [("n", b"7"), ("empty", None)]),)),
        (0, (TailRecord(3, b"k3", None, None),)),
        (2, ()),  # a range of transaction markers only
    )
    assert records_of_planned(planned) == {
        1: [(7, EventRecord(b"k7", b"v", (("n", b"7"), ("empty", None))))],
        0: [(3, EventRecord(b"k3", None, ()))],
        2: [],
    }


def test_records_are_split_by_partition_in_offset_order() -> None:
    found = dict(partition_chunks([_batch([(1, 7), (0, 3), (1, 5), (0, 4)])]))
    assert {p: [o for o, _ in r] for p, r in found.items()} == {0: [3, 4], 1: [5, 7]}
    offset, record = found[1][0]
    assert (record.key, record.value, record.headers) == (b"k5", b"v", (("n", b"5"),))


def test_large_batches_are_folded_in_chunks_as_they_arrive() -> None:
    batches = [_batch([(0, 1), (1, 1), (0, 2)]), _batch([(0, 3), (1, 2)]), _batch([(1, 3)])]
    seen: list[tuple[int, list[int]]] = []
    for partition, records in partition_chunks(iter(batches), chunk_records=2):
        seen.append((partition, [o for o, _ in records]))
    # Partition 0 reached two records in the first batch, partition 1 in the second.
    assert seen == [(0, [1, 2]), (1, [1, 2]), (0, [3]), (1, [3])]


def test_a_record_behind_a_folded_chunk_is_an_error() -> None:
    chunks = partition_chunks([_batch([(0, 5), (0, 6)]), _batch([(0, 4)])], chunk_records=2)
    assert next(chunks)[1][-1][0] == 6
    with pytest.raises(RuntimeError, match="offset 4 arrived after offset 6"):
        next(chunks)


def test_fast_decode_matches_the_eventsourcing_mapper() -> None:
    codec = EventCodec([Product])
    product = Product(id="sku-9")
    product.receive_shipment(quantity=4)
    product.sell(quantity=1)
    for domain_event in product.collect_events():
        record = codec.encode(domain_event)
        stored = StoredEvent(
            originator_id=record.key.decode(),
            originator_version=int(record.header("version") or b"0"),
            topic=(record.header("event-type") or b"").decode(),
            state=record.value or b"",
        )
        expected = codec._mapper.to_domain_event(stored)
        decoded = codec.decode(record)
        assert type(decoded) is type(expected) and vars(decoded) == vars(expected)


def test_arrow_batches_are_built_without_importing_pandas() -> None:
    probe = (
        "import sys, pyarrow as pa\n"
        "from foldstream.projections.worker import arrow_without_pandas\n"
        "arrow_without_pandas()\n"
        "pa.array([b'key', None])\n"
        "assert 'pandas' not in sys.modules, 'pyarrow imported pandas'\n"
        "assert pa.table({'a': [1]}).to_pandas()['a'].tolist() == [1]\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_spark_planning_workers_do_not_load_pyarrow() -> None:
    probe = (
        "import sys\n"
        "import foldstream.projections.datasources\n"
        "loaded = {'pyarrow', 'numpy', 'pandas'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


@pytest.mark.parametrize(
    ("stored", "landed", "position"),
    [
        (None, [0, 1, 2], 2),
        (2, [4, 3], 4),
        (2, [4, 5], 2),  # another writer's record at 3: a copy resuming from here must read it
        (2, [3, 5], 2),  # ... or among this batch's
        (None, [1], None),
    ],
)
def test_thechangelog_position_never_passes_another_writers_records(
    stored: int | None, landed: list[int], position: int | None
) -> None:
    assert changelog_position(stored, landed) == position


def test_a_failed_query_is_restarted_after_waits_that_double_up_to_a_cap() -> None:
    assert [restart_delay(n) for n in range(1, 9)] == [1, 2, 4, 5, 5, 5, 5, 5]


def test_a_failed_querys_error_is_summed_up_by_the_python_error_its_task_raised() -> None:
    spark_error = (  # as Spark 4 words a Python task's failure
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        "thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "/x/projections/source.py", line 305, in read\n'
        "    applied = fold_task(self.fold_options, [partition.planned], records_of_planned)\n"
        "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "foldstream.errors.BrokerUnavailable: unavailable on purpose\n"
        " SQLSTATE: 38000\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1097)\n"
    )
    assert _error_summary(spark_error) == (
        "foldstream.errors.BrokerUnavailable: unavailable on purpose"
    )
    assert _error_summary("RuntimeError: boom\nmore") == "RuntimeError: boom"
    assert _error_summary("the first line\nthe second") == "the first line"
