"""An instance's metrics: Spark's progress reports and the command counts, in Prometheus' text
format, and what :mod:`foldstream.scrape` reads back from two expositions."""

from __future__ import annotations

from typing import Any

import pytest

from foldstream.metrics import InstanceMetrics
from foldstream.scrape import activity, samples


def progress(total_ms: int, rows: int, **phases: int) -> dict[str, Any]:
    """A progress report of Spark's shape (``StreamingQueryProgress.json()``, the parts read)."""
    return {
        "name": "inventory.stock",
        "numInputRows": rows,
        "durationMs": {"triggerExecution": total_ms, **phases},
    }


def test_activity_between_two_expositions() -> None:
    counts = {"transactions": 3, "commands": 10}
    metrics = InstanceMetrics(command_counts=lambda: counts)
    before = samples(metrics.exposition().decode())
    metrics.observe_progress("stock", progress(200, 7, addBatch=150, walCommit=20))
    metrics.observe_progress("stock", progress(100, 3, addBatch=50, walCommit=10))
    metrics.observe_progress("other", progress(900, 1000, addBatch=800))
    counts.update(transactions=5, commands=14)

    since = activity(before, samples(metrics.exposition().decode()), "stock")

    assert (since.batches, since.records) == (2, 10)
    assert since.batch_mean_ms == pytest.approx(150)
    assert since.phase_mean_ms == pytest.approx({"addBatch": 100, "walCommit": 15})
    assert (since.transactions, since.commands) == (2, 4)
    assert "2 micro-batches of 10 records, mean 150 ms" in since.describe()
    assert "2.0 commands per transaction" in since.describe()


def test_no_command_side_yet_counts_zero() -> None:
    metrics = InstanceMetrics(command_counts=lambda: None)
    exposed = samples(metrics.exposition().decode())
    assert exposed[("foldstream_commands_committed_total", frozenset())] == 0


def test_a_report_without_a_trigger_time_is_not_a_batch() -> None:
    metrics = InstanceMetrics(command_counts=lambda: None)
    before = samples(metrics.exposition().decode())
    metrics.observe_progress("stock", {"name": "inventory.stock", "durationMs": {}})
    since = activity(before, samples(metrics.exposition().decode()), "stock")
    assert (since.batches, since.records, since.batch_mean_ms) == (0, 0, 0.0)
