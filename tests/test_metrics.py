"""An instance's metrics: Spark's progress reports and the command counts, in Prometheus' text
format, and what :mod:`foldstream.scrape` reads back from two expositions."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from foldstream.metrics import InstanceMetrics, _ProgressListener
from foldstream.projections.task_steps import STEPS
from foldstream.scrape import activity, samples


def progress(total_ms: int, **phases: int) -> dict[str, Any]:
    """A progress report of Spark's shape (``StreamingQueryProgress.json()``, the parts read)."""
    return {
        "name": "inventory.stock",
        "numInputRows": 1,  # the partitions the tasks advanced: not the records
        "durationMs": {"triggerExecution": total_ms, **phases},
    }


def test_activity_between_two_expositions() -> None:
    counts = {"transactions": 3, "commands": 10}
    metrics = InstanceMetrics(command_counts=lambda: counts)
    before = samples(metrics.exposition().decode())
    no_time = dict.fromkeys(STEPS, 0.0)
    metrics.observe_progress("stock", progress(200, addBatch=150, walCommit=20))
    metrics.observe_task("stock", no_time, 7)
    metrics.observe_progress("stock", progress(100, addBatch=50, walCommit=10))
    metrics.observe_task("stock", no_time, 3)
    metrics.observe_progress("other", progress(900, addBatch=800))
    metrics.observe_task("other", no_time, 1000)
    counts.update(transactions=5, commands=14)

    since = activity(before, samples(metrics.exposition().decode()), "stock")

    assert (since.batches, since.records) == (2, 10)
    assert since.batch_mean_ms == pytest.approx(150)
    assert since.phase_mean_ms == pytest.approx({"addBatch": 100, "walCommit": 15})
    assert (since.transactions, since.commands) == (2, 4)
    assert "2 micro-batches of 10 records, mean 150 ms" in since.describe()
    assert "2.0 commands per transaction" in since.describe()


def test_task_steps_are_averaged_per_task() -> None:
    metrics = InstanceMetrics(command_counts=lambda: None)
    before = samples(metrics.exposition().decode())
    steps = dict.fromkeys(STEPS, 0.0)
    metrics.observe_task("stock", {**steps, "input": 0.040, "changelog": 0.010}, 1)
    metrics.observe_task("stock", {**steps, "input": 0.060, "fold": 0.004}, 1)
    metrics.observe_task("other", {**steps, "input": 9.0}, 1)

    since = activity(before, samples(metrics.exposition().decode()), "stock")

    assert since.tasks == 2
    assert since.task_mean_ms == pytest.approx(
        {**steps, "input": 50.0, "fold": 2.0, "changelog": 5.0}
    )
    assert (
        "2 tasks, mean ms per step (input 50.0, decode 0.0, read 0.0, fold 2.0, changelog 5.0"
        in (since.describe())
    )


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


class _ProgressEvent:
    """The part of py4j's ``QueryProgressEvent`` proxy the listener calls."""

    def __init__(self, progress: dict[str, Any] | str) -> None:
        self._json = progress if isinstance(progress, str) else json.dumps(progress)

    def progress(self) -> _ProgressEvent:
        return self

    def json(self) -> str:
        return self._json


def test_the_listener_records_the_queries_it_was_given_and_survives_bad_reports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = InstanceMetrics(command_counts=lambda: None)
    shared = "inventory.stock+sales_10m"
    listener = _ProgressListener(
        metrics, {"inventory.stock": ("stock",), shared: ("stock", "sales_10m")}
    )
    before = samples(metrics.exposition().decode())

    listener.onQueryProgress(_ProgressEvent(progress(120, addBatch=90)))
    listener.onQueryProgress(_ProgressEvent({**progress(500), "name": "someone.else"}))
    with caplog.at_level(logging.ERROR, logger="foldstream.metrics"):
        listener.onQueryProgress(_ProgressEvent("not json"))
    # A query shared by two stores: its micro-batch counts for each.
    listener.onQueryProgress(_ProgressEvent({**progress(60), "name": shared}))

    after = samples(metrics.exposition().decode())
    since = activity(before, after, "stock")
    assert (since.batches, since.batch_mean_ms) == (2, 90.0)
    since = activity(before, after, "sales_10m")
    assert (since.batches, since.batch_mean_ms) == (1, 60.0)
    assert "recording a projection's progress" in caplog.text
