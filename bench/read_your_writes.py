"""Read-your-writes (``python -m bench --only ryw``): how long after a command's answer the first
query that sends its consistency token back is answered, beside polling without the token until
the value shows, on the same inventory instance in the same run.

One client, one request at a time over a keep-alive connection: each probe sends a command (one
item received by one of :data:`PRODUCTS` products), then either asks ``GET
/stores/stock/keys/{sku}?consistent_with=TOKEN`` once (again only after a 503) or polls the
lookup without the token every :data:`POLL_S` until ``on_hand`` shows the command; the two kinds
alternate. Every command the products get (the warm-up's too) receives one item, so the stock
that includes a command is its answer's version less one (the first event creates the product):
an answer to a token that shows less is counted as older than its token.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import httpx

from bench.commands import COMMAND_PATH, command_load, version_of
from bench.freshness import percentile
from bench.inventory import PARTITIONS
from bench.lookups import Target, warm_up
from bench.procs import pid_of
from bench.report import Figure
from bench.run import BenchRun
from bench.workload import sku
from foldstream.process import InstanceProcess
from foldstream.tokens import PARAM

PRODUCTS = 50
#: The pause between two polls (as the other freshness probes of the benches poll).
POLL_S = 0.002
#: The longest a probe waits for its value.
PROBE_TIMEOUT_S = 30.0


@dataclass
class Probes:
    """Milliseconds from each command's answer until its effect was read, per way of reading,
    and what the token's answers were."""

    with_token: list[float] = field(default_factory=list)
    polling: list[float] = field(default_factory=list)
    polls: int = 0  # lookups the polling probes sent
    older_than_token: int = 0  # answers to a token without the command's effect
    unavailable: int = 0  # 503s to a token (asked again)
    lost: int = 0  # probes whose value never showed


def _command(client: httpx.Client, url: str, key: str) -> tuple[str, int]:
    """Send the command for ``key``; its token and the stock that includes it."""
    answer = client.post(url + COMMAND_PATH.format(key=key), json={"quantity": 1})
    answer.raise_for_status()
    return str(answer.json()["token"]), version_of(answer.json()) - 1


def _on_hand(answer: httpx.Response) -> int | None:
    return int(answer.json()["value"]["on_hand"]) if answer.status_code == 200 else None


def _with_token(client: httpx.Client, url: str, key: str, probes: Probes) -> None:
    token, expected = _command(client, url, key)
    acknowledged = time.perf_counter()
    while time.perf_counter() - acknowledged < PROBE_TIMEOUT_S:
        answer = client.get(f"{url}/stores/stock/keys/{key}", params={PARAM: token})
        if answer.status_code == 503:
            probes.unavailable += 1
            continue
        on_hand = _on_hand(answer)
        probes.with_token.append((time.perf_counter() - acknowledged) * 1e3)
        if on_hand is None or on_hand < expected:
            probes.older_than_token += 1
        return
    probes.lost += 1


def _polling(client: httpx.Client, url: str, key: str, probes: Probes) -> None:
    _, expected = _command(client, url, key)
    acknowledged = time.perf_counter()
    while time.perf_counter() - acknowledged < PROBE_TIMEOUT_S:
        probes.polls += 1
        on_hand = _on_hand(client.get(f"{url}/stores/stock/keys/{key}"))
        if on_hand is not None and on_hand >= expected:
            probes.polling.append((time.perf_counter() - acknowledged) * 1e3)
            return
        time.sleep(POLL_S)
    probes.lost += 1


def _probe(url: str, count: int) -> Probes:
    """``count`` probes, the two ways alternated."""
    probes, rng = Probes(), random.Random(25)
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        for n in range(count):
            way = _with_token if n % 2 == 0 else _polling
            way(client, url, sku(rng.randrange(PRODUCTS)), probes)
    return probes


def read_your_writes_figures(run: BenchRun, bootstrap: str) -> list[Figure]:
    count = run.size["ryw_probes"]
    instance = InstanceProcess(
        bootstrap=bootstrap,
        state_dir=run.tmp / "ryw",
        partitions=PARTITIONS,
        log_path=run.tmp / "ryw.log",
    )
    with instance:
        run.step("starting an inventory instance", lambda: instance.wait_ready(timeout=600))
        target = Target("inventory instance", instance.url, pid_of(instance))
        run.step(
            "warming the instance up with commands",
            lambda: warm_up(run.wrk, target, command_load(PRODUCTS), run.size["seconds"]),
        )
        instance.wait_ready(timeout=600)
        probes: Probes = run.step(
            f"{count} probes: command → query with its token, or polling",
            lambda: _probe(instance.url, count),
        )
    return _figures(probes)


def _percentile(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def _figures(probes: Probes) -> list[Figure]:
    token = {q: _percentile(probes.with_token, q) for q in (0.5, 0.99)}
    polled = {q: _percentile(probes.polling, q) for q in (0.5, 0.99)}
    # The bound is the polling p50 plus 20 ms: as a ratio to this run's polling p50.
    bound = (polled[0.5] + 20.0) / polled[0.5] if polled[0.5] else 1.0
    counts = (
        f"{len(probes.with_token)} token probes ({probes.unavailable} 503s asked again), "
        f"{len(probes.polling)} polling probes ({probes.polls} lookups, every "
        f"{POLL_S * 1e3:g} ms), {probes.lost} lost; one client, one request at a time"
    )
    return [
        Figure(
            "read-your-writes p50: command answered → first query with its token answered",
            token[0.5],
            "ms",
            polled[0.5],
            "polling the lookup without the token until the value shows (p50)",
            ("<=", bound),
            note=f"target: polling p50 + 20 ms = {(polled[0.5] or 0) + 20:.1f} ms; {counts}",
            details=vars(probes),
        ),
        Figure(
            "read-your-writes p99",
            token[0.99],
            "ms",
            polled[0.99],
            "polling until the value shows (p99)",
            note="info",
        ),
        Figure(
            "answers to a token older than the token",
            probes.older_than_token,
            "answers",
            target=("<=", 0),
            absolute=True,
            note=f"each answer's on_hand checked against its command's answer (version − 1); "
            f"{counts}",
        ),
    ]
