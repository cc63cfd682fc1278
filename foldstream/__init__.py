"""foldstream: event sourcing on Kafka with PySpark projections folded into queryable RocksDB.

The layers live in subpackages, strictly one-way: ``foldstream.domain`` →
``foldstream.commands`` / ``foldstream.projections`` → ``foldstream.query_api``. ``foldstream``
itself holds the runtime that wires them together (settings, Kafka, Spark, state, CLI).
"""

from __future__ import annotations

__version__ = "0.1.0"
