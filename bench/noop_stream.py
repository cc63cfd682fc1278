"""The reference micro-batch: a do-nothing Python Data Source stream reader (one new row per
batch) into a do-nothing Python Arrow stream writer, in a session with the projection's settings
(:func:`foldstream.spark.spark_session`)."""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming import StreamingQueryListener

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class _Reader(DataSourceStreamReader):
    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"n": start["n"] + 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(end["n"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (partition.value,)

    def commit(self, end: dict[str, int]) -> None:
        pass


class _Writer(DataSourceStreamArrowWriter):
    """Reads its input and appends how long that took (s) to the file ``waits``: the same
    wait as a projection task's ``input`` step (:mod:`foldstream.projections.task_steps`)."""

    def __init__(self, waits: str) -> None:
        self.waits = waits

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        started = time.perf_counter()
        for _ in iterator:
            pass
        with open(self.waits, "a") as waits:
            waits.write(f"{time.perf_counter() - started}\n")
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class NoopSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench-noop"

    def schema(self) -> str:
        return "n INT"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Reader()

    def streamWriter(self, schema: Any, overwrite: bool) -> _Writer:
        return _Writer(self.options["waits"])


class _Batches(StreamingQueryListener):
    """Sets ``done`` once the query reported ``batches`` micro-batches (or stopped)."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.done = threading.Event()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        if event.progress.batchId + 1 >= self.batches:
            self.done.set()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.done.set()


def noop_batch_ms(spark: SparkSession, batches: int = 40, warmup: int = 5) -> dict[str, float]:
    """Median and p90 of the do-nothing query's batch time (ms), after ``warmup`` batches, the
    mean of each phase Spark reports (``phase <name>``), and the median time its writer waited
    for its input (``task input``)."""
    spark.dataSource.register(NoopSource)
    listener = _Batches(batches + warmup)
    spark.streams.addListener(listener)
    with tempfile.TemporaryDirectory(prefix="bench-noop-") as scratch:
        waits = Path(scratch, "waits")
        query = (
            spark.readStream.format("bench-noop")
            .load()
            .writeStream.format("bench-noop")
            .option("checkpointLocation", str(Path(scratch, "checkpoint")))
            .option("waits", str(waits))
            .start()
        )
        try:
            if not listener.done.wait(600):
                raise TimeoutError("the do-nothing query did not run its batches in 600s")
            progress = query.recentProgress
        finally:
            query.stop()
            spark.streams.removeListener(listener)
        input_waits = [float(line) for line in waits.read_text().split()[warmup:]]
    measured = progress[warmup:]
    times = sorted(p["durationMs"]["triggerExecution"] for p in measured)
    phases = {phase for p in measured for phase in p["durationMs"]} - {"triggerExecution"}
    return {
        "median": statistics.median(times),
        "p90": times[int(len(times) * 0.9)],
        "batches": len(times),
        "task input": statistics.median(input_waits) * 1e3,
        **{
            f"phase {phase}": statistics.fmean(p["durationMs"].get(phase, 0) for p in measured)
            for phase in sorted(phases)
        },
    }
