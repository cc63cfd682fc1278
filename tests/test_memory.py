"""The malloc arena cap reaches the processes an instance starts, unless the operator set one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SHOW_CHILD_SETTING = (
    "from foldstream.memory import limit_malloc_arenas; limit_malloc_arenas(); "
    "import subprocess, sys; "
    "subprocess.run([sys.executable, '-c', "
    "'import os; print(os.environ.get(\"MALLOC_ARENA_MAX\"))'], check=True)"
)


@pytest.mark.parametrize(("operator", "seen"), [(None, "2"), ("4", "4")])
def test_children_inherit_the_arena_cap(operator: str | None, seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if operator is not None:
        env["MALLOC_ARENA_MAX"] = operator
    shown = subprocess.run(
        [sys.executable, "-c", SHOW_CHILD_SETTING],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == seen
    assert "failed" not in shown.stderr
