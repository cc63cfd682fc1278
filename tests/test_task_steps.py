"""A task's account of its steps (:mod:`foldstream.projections.task_steps`), on a clock that
advances only when told to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from foldstream.projections import task_steps
from foldstream.projections.task_steps import TaskSteps


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(task_steps.time, "perf_counter", clock)
    return clock


def test_a_nested_step_counts_for_itself_only(clock: Clock) -> None:
    steps = TaskSteps()
    with steps.step("decode"):
        clock.now += 1.0
        with steps.step("input"):
            clock.now += 5.0
        clock.now += 2.0
    with steps.step("fold"):
        clock.now += 0.5
    assert steps.seconds == {
        **dict.fromkeys(task_steps.STEPS, 0.0),
        "decode": 3.0,
        "input": 5.0,
        "fold": 0.5,
    }


def test_waited_counts_producing_each_item_and_the_end(clock: Clock) -> None:
    def slow() -> Iterator[int]:
        for n in range(3):
            clock.now += 1.0
            yield n
        clock.now += 0.25  # finding there is nothing more takes time too

    steps = TaskSteps()
    consumed = []
    for n in steps.waited(slow(), "input"):
        clock.now += 10.0  # the consumer's own time is not the wait
        consumed.append(n)
    assert consumed == [0, 1, 2]
    assert steps.seconds["input"] == 3.25
