"""How much each section of a bench run measures: a quick (smoke) run's sizes and a full run's."""

from __future__ import annotations

from typing import Any


def sizes(quick: bool) -> dict[str, Any]:
    """The sizes of a run: ``--quick``'s (a smoke run) or the full run's."""
    if quick:
        return dict(
            events=100_000,
            keys=20_000,
            lookup_keys=100_000,
            seconds=3.0,
            rounds=1,
            rate=1000.0,
            fresh_seconds=8.0,
            noop_batches=15,
            command_keys=2_000,
            command_rate=200.0,
            cluster_keys=20_000,
            cluster_lookups=4_000,
            windowed_events=100_000,
            windowed_keys=100,
            range_customers=1_000,
            range_bookings=120,
            rekey_probes=40,
            rekey_events=5_000,
            rekey_rounds=1,
            takeover_events=50_000,
            takeover_aggregates=5_000,
            held_aggregates=200_000,
            ryw_probes=100,
            source_events=60_000,
            source_keys=20_000,
            source_fresh_seconds=5.0,
            source_rounds=1,
        )
    return dict(
        events=2_000_000,
        keys=100_000,
        lookup_keys=1_000_000,
        seconds=10.0,
        rounds=2,
        rate=1000.0,
        fresh_seconds=30.0,
        noop_batches=40,
        command_keys=2_000,
        command_rate=200.0,
        cluster_keys=200_000,
        cluster_lookups=40_000,
        windowed_events=1_000_000,
        windowed_keys=500,
        range_customers=5_000,
        range_bookings=200,
        rekey_probes=200,
        rekey_events=100_000,
        rekey_rounds=3,
        takeover_events=1_000_000,
        takeover_aggregates=100_000,
        held_aggregates=5_000_000,
        ryw_probes=400,
        source_events=200_000,
        source_keys=50_000,
        source_fresh_seconds=60.0,
        source_rounds=3,
    )
