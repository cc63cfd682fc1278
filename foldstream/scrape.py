"""Reading an instance's ``GET /metrics`` (:mod:`foldstream.metrics`) from outside: its samples,
and what happened between two scrapes (a projection's micro-batches: count, records, mean
duration, mean of each phase Spark reports; the command side's transactions). Benchmarks and the
test steps use it."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from foldstream.projections.task_steps import STEPS

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of ``url``/metrics, keyed by name and labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        body = response.read()
        kind = response.headers.get("content-type", "")
    if not kind.startswith("text/plain"):
        raise ValueError(f"{url}/metrics answered {kind!r}, not Prometheus' text format")
    return samples(body.decode())


def samples(exposition: str) -> Samples:
    """The samples of a text in Prometheus' text format, keyed by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


@dataclass(frozen=True)
class Activity:
    """Between two scrapes: micro-batches of ``store`` and command transactions."""

    batches: int
    records: int
    batch_mean_ms: float
    phase_mean_ms: dict[str, float]
    transactions: int
    commands: int
    tasks: int = 0
    #: Mean ms per task of each step the tasks report (``input``, ``fold``, ``changelog``...).
    task_mean_ms: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        phases = ", ".join(
            f"{phase} {ms:.0f}" for phase, ms in sorted(self.phase_mean_ms.items()) if ms >= 1
        )
        steps = ", ".join(f"{step} {ms:.1f}" for step, ms in self.task_mean_ms.items())
        tasks = f"{self.tasks} tasks, mean ms per step ({steps}); " if self.tasks else ""
        per_tx = self.commands / self.transactions if self.transactions else 0.0
        return (
            f"projection: {self.batches} micro-batches of {self.records} records, "
            f"mean {self.batch_mean_ms:.0f} ms "
            f"({phases}); {tasks}{per_tx:.1f} commands per transaction"
        )


def activity(before: Samples, after: Samples, store: str) -> Activity:
    """What happened between the scrapes ``before`` and ``after``."""

    def change(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)

    batches = int(change("foldstream_projection_batch_seconds_count", store=store))

    def mean_ms(name: str, count: int, **labels: str) -> float:
        """The mean over ``count`` (batches or tasks) of a duration histogram's sum, in ms."""
        return change(name, store=store, **labels) / count * 1e3 if count else 0.0

    phases = {
        dict(labels)["phase"]
        for name, labels in after
        if name == "foldstream_projection_phase_seconds_count"
        and dict(labels).get("store") == store
    }
    tasks = int(change("foldstream_projection_task_seconds_count", store=store, step=STEPS[0]))
    return Activity(
        tasks=tasks,
        task_mean_ms={
            step: mean_ms("foldstream_projection_task_seconds_sum", tasks, step=step)
            for step in STEPS
        }
        if tasks
        else {},
        batches=batches,
        records=int(change("foldstream_projection_records_total", store=store)),
        batch_mean_ms=mean_ms("foldstream_projection_batch_seconds_sum", batches),
        phase_mean_ms={
            phase: mean_ms("foldstream_projection_phase_seconds_sum", batches, phase=phase)
            for phase in phases
        }
        if batches
        else {},
        transactions=int(change("foldstream_command_transactions_total")),
        commands=int(change("foldstream_commands_committed_total")),
    )
