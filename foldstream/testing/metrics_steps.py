"""Steps for an instance's ``GET /metrics``, read with :mod:`foldstream.scrape`.

::

    Given the instance's metrics were read
    Then its metrics count 2 more committed commands, in 1 or 2 transactions
    And its metrics show micro-batches of store "stock" that read at least 2 records
    Then its metrics count 1 more late record of store "sales_10m"
"""

from __future__ import annotations

from pytest_bdd import given, parsers, then

from foldstream.process import InstanceProcess
from foldstream.scrape import Activity, Samples, activity, scrape
from foldstream.testing.steps import wait_until


@given("the instance's metrics were read", target_fixture="metrics_before")
def metrics_read(instance: InstanceProcess) -> Samples:
    return scrape(instance.url)


@then(
    parsers.parse(
        "its metrics count {commands:d} more committed commands, "
        "in {fewest:d} or {most:d} transactions"
    )
)
def commands_counted(
    instance: InstanceProcess, metrics_before: Samples, commands: int, fewest: int, most: int
) -> None:
    # Counted before the command is answered: no waiting.
    since = activity(metrics_before, scrape(instance.url), store="")
    assert since.commands == commands, since
    assert fewest <= since.transactions <= most, since


@then(
    parsers.parse(
        'its metrics show micro-batches of store "{store}" that read at least {records:d} records'
    )
)
def batches_shown(
    instance: InstanceProcess, metrics_before: Samples, store: str, records: int
) -> None:
    last: list[Activity] = []

    def counted() -> bool:
        # Spark reports a micro-batch's progress after it committed: the values may be served
        # a moment before their batch is counted.
        last[:] = [activity(metrics_before, scrape(instance.url), store)]
        return last[0].records >= records and last[0].batches >= 1

    wait_until(counted, lambda: f"the metrics show {last}")
    since = last[0]
    assert since.batches >= 1 and since.batch_mean_ms > 0, since
    # Spark's parts of a micro-batch, as it names them: the one that runs the fold among them.
    assert since.phase_mean_ms.get("addBatch", 0) > 0, since
    assert since.phase_mean_ms["addBatch"] <= since.batch_mean_ms, since
    # The tasks' own account of that time, step by step, through the store host.
    assert since.tasks >= 1, since
    assert since.task_mean_ms["fold"] > 0 and since.task_mean_ms["changelog"] > 0, since


@then(
    parsers.re(
        r'its metrics count (?P<records>\d+) more late records? of store "(?P<store>[\w-]+)"'
    )
)
def late_counted(
    instance: InstanceProcess, metrics_before: Samples, records: str, store: str
) -> None:
    """The windowed store's tasks report the late records they dropped once their batch is
    committed: counted a moment after the windows are served."""
    key = ("foldstream_projection_late_records_total", frozenset({("store", store)}))
    before = metrics_before.get(key, 0.0)
    seen: list[float] = []

    def counted() -> bool:
        seen[:] = [scrape(instance.url).get(key, 0.0) - before]
        return seen[0] >= int(records)

    wait_until(counted, lambda: f"{seen} more late records of {store}")
    assert seen[0] == int(records), seen
