"""Spark's Python worker daemon (``spark.python.daemon.module``), with what every task worker
imports loaded before it forks them.

Spark forks each Python worker from a daemon that has imported little. Each task worker then
imports pyarrow, confluent-kafka and the projection modules on its own: private memory in every
worker, and an instance runs one per core (each task reads and folds in one).
Imported here, those pages are shared by all the forked workers. Daemons of Spark's other
Python workers (data source planning) are left as they are: they import none of it.

Spark's daemon forks without threads of its own. These imports start none in Python; pyarrow's
bundled jemalloc starts a background thread, which jemalloc's fork handlers account for in each
child, and numpy's OpenBLAS starts none, as Spark sets ``OMP_NUM_THREADS`` for its workers
(``spark.task.cpus``, 1 by default). The forked workers run every test and benchmark here.
"""

from __future__ import annotations

import gc
import sys

from pyspark.daemon import manager

TASK_WORKER = "pyspark.worker"

if __name__ == "__main__":
    if sys.argv[1:2] in ([], [TASK_WORKER]):
        import confluent_kafka  # noqa: F401
        import pyarrow  # noqa: F401

        import foldstream.projections.fold  # noqa: F401
        import foldstream.projections.source  # noqa: F401

        # Keep the collector from touching (and so copying) the shared pages in every worker.
        gc.freeze()
    manager()
