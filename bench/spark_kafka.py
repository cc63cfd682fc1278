"""A projection read by Spark's own Kafka source (``spark-sql-kafka-0-10``) instead of
foldstream's Python Data Source, for ``python -m bench --only sources``.

The records are rows in the JVM (the connector's Java consumer reads them, ``read_committed``
through ``kafka.isolation.level``), handed to a Python worker as Arrow batches by
``mapInArrow``, and folded there by the very task code foldstream's own source runs
(:func:`~foldstream.projections.fold_task.fold_task`: the store host, values and source offset
in one write batch, the changelog acknowledged first), one row per partition advanced to the
JVM's ``noop`` sink. Spark's checkpoint holds the Kafka source's offsets, but as in foldstream
it is scratch: each query starts from the offsets the stores hold (``startingOffsets``), and a
replayed micro-batch applies nothing twice because the fold skips what its store holds.

The connector is not part of pyspark: its jars are fetched with Maven into foldstream's cache
(:func:`connector_jars`), the ones pyspark ships left out.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from foldstream.broker.jars import maven_jars
from foldstream.domain.records import EventRecord
from foldstream.projections.chunks import Records
from foldstream.projections.datasources import FOLD_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

#: The connector's version. pyspark is 4.3.0, but Maven Central serves the connector up to
#: 4.2.0 only (checked 2026-11-29): 4.2.0 runs on Spark 4.3.0's JVM in these measurements,
#: which Spark does not promise across minor versions.
CONNECTOR_VERSION = "4.2.0"
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>foldstream</groupId>
  <artifactId>spark-kafka-connector</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_2.13</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""
#: The columns the fold needs, of the Kafka source's rows (``topic`` and ``timestampType``
#: left in the JVM).
COLUMNS = ("partition", "offset", "key", "value", "timestamp", "headers")


def connector_jars(version: str = CONNECTOR_VERSION) -> list[Path]:
    """The jars ``spark.jars`` needs for ``format("kafka")``: the connector and what it needs
    at run time, fetched with Maven on first use, less those pyspark ships (Scala, Hadoop's
    client, compression codecs, SLF4J: pyspark's own versions are the ones loaded)."""
    import pyspark

    libs = maven_jars(
        f"spark-sql-kafka-{version}",
        _POM.format(version=version),
        what=f"Spark's Kafka connector {version}",
        remedy="run the bench on a machine that does",
    )
    shipped = {_artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(jar for jar in libs.glob("*.jar") if _artifact(jar) not in shipped)


def _artifact(jar: Path) -> str:
    """A jar's artifact name, up to its first ``-<digit>``: ``kafka-clients-3.9.2.jar`` ->
    ``kafka-clients`` (``spark-sql-kafka-0-10_2.13-4.2.0.jar`` -> ``spark-sql-kafka``, which
    pyspark does not ship either)."""
    named = _VERSIONED.match(jar.name)
    return named.group(1) if named else jar.name


_VERSIONED = re.compile(r"(.+?)-\d")


def records_of_arrow(batch: pa.RecordBatch) -> dict[int, Records]:
    """The Kafka source's rows (:data:`COLUMNS`) as ``{partition: records}``, each partition's
    in the order of the rows, as :func:`~foldstream.projections.chunks.records_of_messages`
    makes them of a consumer's messages (timestamps in milliseconds)."""
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    micros = batch.column("timestamp").cast(pa.int64())
    stamps = pc.divide(micros, 1000).to_pylist()
    headers = _headers(batch.column("headers"))
    found: dict[int, Records] = {}
    for partition, offset, key, value, header, stamp in zip(
        partitions, offsets, keys, values, headers, stamps, strict=True
    ):
        found.setdefault(partition, []).append((offset, EventRecord(key, value, header, stamp)))
    return found


def _headers(column: pa.ListArray) -> list[tuple[tuple[str, bytes], ...]]:
    """Each row's headers as ``((name, value), ...)``, from the list column's flat children
    (a row without headers, or a null list, has none)."""
    bounds = column.offsets.to_pylist()
    # Arrow lets a null list's offsets span entries of any content: a null row has none.
    valid = column.is_valid().to_pylist()
    entries = column.values  # every row's, not sliced: ``bounds`` index into them
    names, values = entries.field("key").to_pylist(), entries.field("value").to_pylist()
    pairs = list(zip(names, values, strict=True))
    return [
        tuple(pairs[start:end]) if present else ()
        for (start, end), present in zip(itertools.pairwise(bounds), valid, strict=True)
    ]


def fold_arrow(
    options: Mapping[str, str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: fold one Spark task's rows as foldstream's own reader folds
    its records, and yield a row of :data:`FOLD_SCHEMA` per partition advanced."""
    from foldstream.kafka_client import install_from_options
    from foldstream.projections.fold_task import fold_task
    from foldstream.projections.worker import arrow_without_pandas

    install_from_options(options)
    arrow_without_pandas()
    applied = fold_task(options, batches, records_of_arrow)
    rows = sorted(applied.items())
    yield pa.RecordBatch.from_arrays(
        [
            pa.array([p for p, _ in rows], pa.int32()),
            pa.array([count for _, (count, _) in rows], pa.int64()),
            pa.array([offset for _, (_, offset) in rows], pa.int64()),
        ],
        names=["partition", "applied", "offset"],
    )


def kafka_source_query(
    spark: SparkSession,
    *,
    fold_options: Mapping[str, str],
    starts: Mapping[int, int],
    max_records_per_partition: int,
    checkpoint: Path,
    name: str,
    tasks: int | None = None,
) -> StreamingQuery:
    """The projection of ``fold_options`` (those foldstream's own source gets: ``bootstrap``,
    ``topic``, ``service``, ``stores``, ``store_host``, ``store_token``) as a query reading
    ``starts`` (``{partition: offset}``) with Spark's Kafka source. ``tasks``: merge each
    micro-batch's Kafka partitions into that many tasks (``coalesce``); by default the source
    makes one task per Kafka partition with new records."""
    topic = fold_options["topic"]
    offsets = {topic: {str(p): o for p, o in sorted(starts.items())}}
    rows = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", fold_options["bootstrap"])
        .option("assign", json.dumps({topic: sorted(starts)}))
        .option("startingOffsets", json.dumps(offsets))
        # A command's events are one transaction: a fenced writer's must never be folded.
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        # The cap foldstream's source applies per partition, over all of them.
        .option("maxOffsetsPerTrigger", str(max_records_per_partition * len(starts)))
        .load()
        .select(*COLUMNS)
    )
    if tasks is not None:
        rows = rows.coalesce(tasks)
    folded = rows.mapInArrow(functools.partial(fold_arrow, dict(fold_options)), FOLD_SCHEMA)
    return (
        folded.writeStream.format("noop")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint / uuid.uuid4().hex))
        .start()
    )


def jvm_pid(spark: SparkSession) -> int:
    """The process id of the session's JVM (its Python workers are its children)."""
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]


def jars_option(jars: Sequence[Path]) -> dict[str, str]:
    """The Spark settings that put ``jars`` on the session's class path."""
    return {"spark.jars": ",".join(str(jar) for jar in jars)}
