"""The nemesis suite's short run (``make nemesis`` runs longer ones): 3 Apache Kafka nodes and 3
instances of the inventory example, each on a host of its own, under commands and reads from 4
clients while each kind of fault is injected once; the recorded history must break none of the
guarantees of docs/concepts/guarantees.md. The clients resend every command without a definite
answer with its Idempotency-Key: every command's outcome ends known, and applied exactly once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rich.console import Console

from tests.nemesis.deployment import Deployment
from tests.nemesis.faults import KINDS
from tests.nemesis.network import network_namespaces_available
from tests.nemesis.run import deployed, run, summary

pytestmark = pytest.mark.skipif(
    network_namespaces_available() is not None,
    reason=f"hosts of their own: {network_namespaces_available()}",
)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployed(tmp_path_factory.mktemp("nemesis"), network=True) as running:
        yield running


def test_every_fault_once_under_load_breaks_no_guarantee(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = run(deployment, seed=42, duration=0, kinds=KINDS, each_once=True, retry_commands=True)
    with capsys.disabled():
        summary(outcome, Console(width=160))
    verdict = outcome.verdict
    commands = [op for op in outcome.history.ops if op.kind == "command"]
    assert {f.target.split()[0] for f in outcome.history.faults} >= {"instance", "broker"}
    assert verdict.checked["acknowledged-once"] > 100, verdict.checked
    assert verdict.checked["reads-token"] > 10, verdict.checked
    # Every command's outcome known and applied exactly once: no op left without an answer.
    assert [op.id for op in commands if op.status in (None, 503)] == []
    assert verdict.checked["outcome-known"] == verdict.checked["applied-once"] == len(commands)
    assert not verdict.total_violations, dict(verdict.violations)
