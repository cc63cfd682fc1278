"""Two-stage stores: freshness of ``top5`` (chained, through a repartition topic) beside
``song_plays`` (single-stage) in the same run, and re-key throughput beside a plain
confluent-kafka pipeline doing the same re-key and fold (``python -m bench --only rekey``).

Freshness: one ``charts`` instance; songs in genres of at most five songs (so every song is on
its chart); each probe plays a song, then polls both stores until each shows the new count.

Throughput: one instance of :mod:`bench.rekey_service` (the positions example's ``exposure``
trades re-keyed by asset, nothing else), ready and idle; trades are produced to its events
topic, and the time until ``exposure`` (the trades re-keyed by asset, through the hidden
forwarder and the repartition topic) holds every trade gives events/s. The reference does the
same with two plain consumers in this process: one re-keys into a repartition topic of its
own (idempotent producer), the other folds with the same ``add_trade`` into a dict.

Both sides first fold :data:`WARM_UP_TRADES` trades of other accounts and assets, untimed: the
figure is the steady rate. A Spark instance's first micro-batch with data pays for starting
Spark's Python task workers and the JVM's first runs of the plan; how long each side took for
the warm-up is printed beside the figure.

The figure is the median of each side over ``rekey_rounds`` rounds, each round the instance
then the plain pipeline, on new accounts and assets: between runs, the machine's speed moved
either side's throughput by more than a third.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.report import Figure
from bench.run import BenchRun
from foldstream.domain import EventCodec
from foldstream.domain.records import EventRecord
from foldstream.examples.positions import Account, add_trade, traded_asset
from foldstream.kafka import (
    TopicSpec,
    consume_available,
    consumer_config,
    ensure_topics,
    partition_for,
    produce_when_room,
    producer_config,
)
from foldstream.process import InstanceProcess, http

PARTITIONS = 3
#: The throughput's instance: the re-keyed store alone, the reference's work (its docstring).
REKEY_SERVICE = "bench.rekey_service:service"
GENRES = 12
SONGS_PER_GENRE = 4
ASSETS = 40
#: Trades each side folds before the timed ones (the module's docstring).
WARM_UP_TRADES = 600
#: How long either side may take to fold what it was given before the section fails.
FOLD_TIMEOUT_S = 600


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())["value"]
    except OSError:
        return None


def _freshness(url: str, probes: int, rng: random.Random) -> tuple[list[float], list[float]]:
    """Milliseconds from a play's acknowledgement until ``song_plays``, and ``top5``, show it."""
    plays: dict[str, int] = {}
    for genre in range(GENRES):
        for n in range(SONGS_PER_GENRE):
            song = f"g{genre}-s{n}"
            body = {"title": song, "artist": "bench", "genre": f"genre-{genre}"}
            status, answer = http("POST", f"{url}/commands/song/{song}/register", body)
            assert status == 200, answer
            plays[song] = 0
    single: list[float] = []
    chained: list[float] = []
    for _ in range(probes):
        song = rng.choice(sorted(plays))
        status, answer = http("POST", f"{url}/commands/song/{song}/play", {})
        acknowledged = time.monotonic()
        assert status == 200, answer
        plays[song] += 1
        genre = f"genre-{song.split('-')[0][1:]}"
        seen: dict[str, float] = {}
        while len(seen) < 2 and time.monotonic() - acknowledged < 30:
            if "single" not in seen:
                value = _get(f"{url}/stores/song_plays/keys/{song}")
                if value and value["plays"] == plays[song]:
                    seen["single"] = time.monotonic()
            if "chained" not in seen:
                chart = _get(f"{url}/stores/top5/keys/{genre}") or {"top": []}
                if any(e["song"] == song and e["plays"] == plays[song] for e in chart["top"]):
                    seen["chained"] = time.monotonic()
            time.sleep(0.002)
        if len(seen) == 2:
            single.append((seen["single"] - acknowledged) * 1000)
            chained.append((seen["chained"] - acknowledged) * 1000)
    return single, chained


def _trades(count: int, rng: random.Random, prefix: str = "") -> list[EventRecord]:
    """``count`` purchases by 200 accounts of ``ASSETS`` assets, encoded as the service
    appends them (the accounts' creation events first); ``prefix`` names other accounts and
    assets."""
    codec = EventCodec([Account])
    accounts = [Account(id=f"{prefix}acct-{n}") for n in range(200)]
    records = [codec.encode(e) for a in accounts for e in a.collect_events()]
    for _ in range(count):
        account = rng.choice(accounts)
        account.buy(f"{prefix}asset-{rng.randrange(ASSETS)}", rng.randint(1, 9))
        records += [codec.encode(e) for e in account.collect_events()]
    return records


def _produce(bootstrap: str, topic: str, records: list[EventRecord]) -> None:
    producer = Producer(producer_config(bootstrap, linger_ms=10))
    for record in records:
        assert record.key is not None
        produce_when_room(
            producer,
            topic,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
            partition=partition_for(record.key, PARTITIONS),
        )
    producer.flush(60)


def _expected_quantities(records: list[EventRecord]) -> dict[str, int]:
    codec, held = EventCodec([Account]), {}
    for record in records:
        event = codec.decode(record)
        if isinstance(event, Account.Bought):
            held[event.asset] = held.get(event.asset, 0) + int(event.quantity)
    return held


def _instance_throughput(
    url: str, bootstrap: str, topic: str, warm_up: list[EventRecord], records: list[EventRecord]
) -> tuple[float, float]:
    """Events/s of ``records`` folded into ``exposure``, and the seconds ``warm_up`` took
    before them (untimed)."""
    started = time.monotonic()
    _produce(bootstrap, topic, warm_up)
    _await_exposure(url, _expected_quantities(warm_up))
    warmed = time.monotonic()
    _produce(bootstrap, topic, records)
    _await_exposure(url, _expected_quantities(records))
    return len(records) / (time.monotonic() - warmed), warmed - started


def _await_exposure(url: str, expected: dict[str, int]) -> None:
    deadline = time.monotonic() + FOLD_TIMEOUT_S
    while not all(
        (v := _get(f"{url}/stores/exposure/keys/{a}")) and v["quantity"] == q
        for a, q in expected.items()
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"exposure at {url} did not hold every trade in {FOLD_TIMEOUT_S} s")
        time.sleep(0.05)


def _assigned(bootstrap: str, topic: str) -> Consumer:
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    return consumer


def _plain_throughput(
    bootstrap: str, prefix: str, warm_up: list[EventRecord], records: list[EventRecord]
) -> tuple[float, float]:
    """The same re-key and fold by two plain consumers and an idempotent producer, and the
    same warm-up first (:func:`_instance_throughput`)."""
    events, repartition = f"{prefix}.events", f"{prefix}.exposure.repartition"
    ensure_topics(bootstrap, [TopicSpec(events, PARTITIONS), TopicSpec(repartition, PARTITIONS)])
    targets = [_expected_quantities(warm_up), _expected_quantities(records)]
    codec = EventCodec([Account])
    warmed, done = threading.Event(), threading.Event()

    def rekey() -> None:
        consumer, producer = _assigned(bootstrap, events), Producer(producer_config(bootstrap))
        while not done.is_set():
            for message in consume_available(consumer, 5000, 0.05):
                if message.error() is not None:
                    continue
                key = traded_asset(codec.decode(EventRecord.from_message(message)))
                if key is not None:
                    produce_when_room(
                        producer,
                        repartition,
                        key=key.encode(),
                        value=message.value(),
                        headers=[*(message.headers() or ()), ("upstream", message.key())],
                        partition=partition_for(key.encode(), PARTITIONS),
                    )
            producer.flush(30)
        consumer.close()

    def fold() -> None:
        consumer, state = _assigned(bootstrap, repartition), {}
        while not done.is_set():
            for message in consume_available(consumer, 5000, 0.05):
                if message.error() is not None:
                    continue
                headers = message.headers() or []
                record = EventRecord(headers[-1][1], message.value(), tuple(headers[:-1]))
                current = state.get(message.key())
                value = add_trade(
                    None if current is None else json.loads(current), codec.decode(record)
                )
                state[message.key()] = json.dumps(value).encode()
            expected = targets[1 if warmed.is_set() else 0]
            if all(
                (v := state.get(a.encode())) is not None and json.loads(v)["quantity"] == q
                for a, q in expected.items()
            ):
                (done if warmed.is_set() else warmed).set()
        consumer.close()

    threads = [threading.Thread(target=rekey), threading.Thread(target=fold)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    _produce(bootstrap, events, warm_up)
    warm = warmed.wait(FOLD_TIMEOUT_S)
    warm_up_s = time.monotonic() - started
    started = time.monotonic()
    if warm:
        _produce(bootstrap, events, records)
    finished = warm and done.wait(FOLD_TIMEOUT_S)
    elapsed = time.monotonic() - started
    done.set()
    for thread in threads:
        thread.join(30)
    if not finished:
        raise TimeoutError(f"the plain re-key and fold did not finish in {FOLD_TIMEOUT_S} s")
    return len(records) / elapsed, warm_up_s


def _instance(run: BenchRun, bootstrap: str, service: str) -> InstanceProcess:
    name = service.split(":")[0].rsplit(".", 1)[-1]
    return InstanceProcess(
        bootstrap=bootstrap,
        state_dir=run.tmp / f"rekey-{name}",
        service=service,
        partitions=PARTITIONS,
        log_path=run.tmp / f"rekey-{name}.log",
    )


def rekey_figures(run: BenchRun, bootstrap: str) -> list[Figure]:
    """The two figures of two-stage stores (sizes: ``rekey_probes``, ``rekey_events``,
    ``rekey_rounds``)."""
    rng = random.Random(22)
    with _instance(run, bootstrap, "foldstream.examples.charts:service") as charts:
        run.step("charts instance ready", charts.wait_ready)
        single, chained = run.step(
            "freshness of song_plays and top5",
            lambda: _freshness(charts.url, run.size["rekey_probes"], rng),
        )
    ensure_topics(bootstrap, [TopicSpec("market.prices", PARTITIONS)])
    rounds = [_rekey_round(run, bootstrap, rng, n) for n in range(run.size["rekey_rounds"])]
    ours = statistics.median(r.ours for r in rounds)
    plain = statistics.median(r.plain for r in rounds)
    return [
        Figure(
            "two-stage freshness p50 (top5)",
            statistics.median(chained) if chained else None,
            "ms",
            statistics.median(single) if single else None,
            "single-stage p50 (song_plays), same run",
            ("<=", 2.2),
            details={"probes": len(chained)},
        ),
        Figure(
            "re-key throughput (exposure)",
            ours,
            "events/s",
            plain,
            "plain confluent-kafka re-key + fold",
            (">=", 0.8),
            note=(
                f"medians of {len(rounds)} alternated rounds of {run.size['rekey_events']:,}"
                " events; by round, ours/plain: "
                + ", ".join(f"{r.ours:,.0f}/{r.plain:,.0f}" for r in rounds)
            ),
            details={
                "events": run.size["rekey_events"],
                "warm_up_events": WARM_UP_TRADES,
                "rounds": [vars(r) for r in rounds],
            },
        ),
    ]


@dataclass
class RekeyRound:
    """One round of the re-key figure: each side's events/s, and the seconds its warm-up took
    (untimed)."""

    ours: float
    plain: float
    ours_warm_up_s: float
    plain_warm_up_s: float


def _rekey_round(run: BenchRun, bootstrap: str, rng: random.Random, n: int) -> RekeyRound:
    """The instance (started again on the same state each round: its rounds' accounts and
    assets are their own), then the plain pipeline on topics of its own, one after the other:
    alternating rounds spread the drift of the machine's speed over both sides."""
    records = _trades(run.size["rekey_events"], rng, prefix=f"round-{n}-")
    warm_up = _trades(WARM_UP_TRADES, rng, prefix=f"warm-up-{n}-")
    with _instance(run, bootstrap, REKEY_SERVICE) as rekeyed:
        run.step(f"re-keying instance ready (round {n + 1})", rekeyed.wait_ready)
        ours, ours_warm_up_s = run.step(
            f"re-key into exposure ({len(warm_up):,} warm-up events first)",
            lambda: _instance_throughput(
                rekeyed.url, bootstrap, "rekeyed.events", warm_up, records
            ),
        )
    plain, plain_warm_up_s = run.step(
        f"plain re-key and fold (round {n + 1})",
        lambda: _plain_throughput(bootstrap, f"plain-rekey-{n}", warm_up, records),
    )
    return RekeyRound(ours, plain, ours_warm_up_s, plain_warm_up_s)
