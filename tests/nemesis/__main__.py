"""``make nemesis``: a nemesis run of a chosen seed and duration, its summary table printed.

python -m tests.nemesis --seed 7 --duration 600
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tests.nemesis.faults import KINDS
from tests.nemesis.network import network_namespaces_available
from tests.nemesis.run import deployed, run, summary


def main(
    seed: Annotated[int, typer.Option(help="the random seed of the faults and the load")] = 1,
    duration: Annotated[float, typer.Option(help="seconds of faults")] = 300.0,
    kinds: Annotated[str, typer.Option(help="comma-separated fault kinds")] = ",".join(KINDS),
    clients: Annotated[int, typer.Option(help="client threads")] = 4,
    retry_commands: Annotated[
        bool, typer.Option(help="resend commands without an answer, with their Idempotency-Key")
    ] = True,
    keep: Annotated[Path | None, typer.Option(help="keep logs and history here")] = None,
) -> None:
    """Inject faults into 3 Kafka nodes and 3 instances under load; check the history."""
    console = Console()
    why_not = network_namespaces_available()
    if why_not:
        console.print(f"partitions left out: {why_not}")
    root = keep or Path(tempfile.mkdtemp(prefix="foldstream-nemesis-"))
    console.print(f"seed {seed}, {duration:.0f} s of faults; logs and history in {root}")
    with deployed(root, network=why_not is None) as deployment:
        outcome = run(
            deployment,
            seed=seed,
            duration=duration,
            kinds=kinds.split(","),
            clients=clients,
            retry_commands=retry_commands,
        )
    summary(outcome, console)
    raise typer.Exit(1 if outcome.verdict.total_violations else 0)


if __name__ == "__main__":
    typer.run(main)
