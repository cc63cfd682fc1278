"""The reference micro-batch: a do-nothing Python Data Source stream reader (one new row per
batch) into a do-nothing Python Arrow stream writer, in a session with the projection's settings
(:func:`foldstream.spark.spark_session`). The same reader into the JVM's ``noop`` sink is the
do-nothing query of the projection's own shape (its tasks fold in the reader)."""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
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
    """Reads its input and appends how long that took (s) to the file ``waits``: how long a
    Python writer waits for the reader's rows, passed on by the JVM."""

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
    """Sets ``done`` once the query named ``name`` reported ``batches`` micro-batches (or
    stopped). Events of other queries are ignored: the bus delivers them late, e.g. the end of
    the previous do-nothing query after this listener was added."""

    def __init__(self, name: str, batches: int) -> None:
        self.name = name
        self.batches = batches
        self.done = threading.Event()
        self._id: str | None = None

    def onQueryStarted(self, event: Any) -> None:
        if event.name == self.name:
            self._id = str(event.id)

    def onQueryProgress(self, event: Any) -> None:
        if event.progress.name == self.name and event.progress.batchId + 1 >= self.batches:
            self.done.set()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if self._id is not None and str(event.id) == self._id:
            self.done.set()


def noop_batch_ms(
    spark: SparkSession, batches: int = 40, warmup: int = 5, *, sink: str = "bench-noop"
) -> dict[str, float]:
    """Median and p90 of the do-nothing query's batch time (ms), after ``warmup`` batches, the
    mean of each phase Spark reports (``phase <name>``), and, with the Python writer (``sink``
    ``"bench-noop"``; ``"noop"`` is the JVM's), the median time it waited for the reader's
    rows (``writer wait``)."""
    spark.dataSource.register(NoopSource)
    name = f"bench-noop-{sink}-{uuid.uuid4().hex[:8]}"
    listener = _Batches(name, batches + warmup)
    spark.streams.addListener(listener)
    with tempfile.TemporaryDirectory(prefix="bench-noop-") as scratch:
        waits = Path(scratch, "waits")
        query = (
            spark.readStream.format("bench-noop")
            .load()
            .writeStream.format(sink)
            .queryName(name)
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
        written = waits.read_text().split() if waits.exists() else []  # none with "noop"
        input_waits = [float(line) for line in written[warmup:]]
        waited = {"writer wait": statistics.median(input_waits) * 1e3} if input_waits else {}
    measured = progress[warmup:]
    times = sorted(p["durationMs"]["triggerExecution"] for p in measured)
    phases = {phase for p in measured for phase in p["durationMs"]} - {"triggerExecution"}
    return {
        "median": statistics.median(times),
        "p90": times[int(len(times) * 0.9)],
        "batches": len(times),
        **waited,
        **{
            f"phase {phase}": statistics.fmean(p["durationMs"].get(phase, 0) for p in measured)
            for phase in sorted(phases)
        },
    }
