"""How far behind each local copy of a store partition is.

An active copy's lag is source records not yet folded in (0 for the aggregate store, which the
command side writes as it appends rather than folds); a standby copy's is changelog records not
yet applied. Lag is published in the cluster map as ``{"<store>/<partition>": records}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from foldstream.changelog import StandbyReplicas, StoreLayout
from foldstream.cluster.versions import VersionSwitch
from foldstream.end_probes import ProbedEnds, holds_records
from foldstream.state.local import LocalStores

log = logging.getLogger(__name__)

#: How long a measurement waits for the source topics' probes (an idle topic's answers in a
#: few ms); a probe answering later gives its ends to the next measurement. Short: the same
#: upkeep round hands partitions over.
PROBE_WAIT_S = 0.05


class LagMeter:
    """Measures the lag of this instance's copies; ``ends`` tracks each source topic's end."""

    def __init__(
        self,
        *,
        bootstrap: str,
        stores: Mapping[str, StoreLayout],
        local: LocalStores,
        replicas: StandbyReplicas,
        ends: Mapping[str, ProbedEnds],
        versions: VersionSwitch | None = None,
    ) -> None:
        """``versions``: which versions of a store count for its partitions' lag (all
        without)."""
        self.bootstrap = bootstrap
        self.stores = stores  # a catalog that may gain stores: not copied
        self.versions = versions
        self._local = local
        self.replicas = replicas
        self.ends = dict(ends)
        for topic_ends in self.ends.values():
            topic_ends.ask()  # the first ends, ready before the first measurement
        # The last measurement and its lag per (topic, partition), computed on first use (every
        # lookup asks): one tuple, replaced whole, so a figure never pairs with another one.
        self._measured: tuple[dict[str, int], dict[tuple[str, int], int | None]] = ({}, {})
        self._empty_spans: dict[tuple[str, int], tuple[int, int]] = {}
        self._last_spans: dict[tuple[str, int], tuple[int, int]] = {}

    def measure(self, active: Iterable[tuple[str, int]]) -> dict[str, int]:
        """Lag of the ``active`` ``(topic, partition)`` copies and of every standby copy."""
        lag: dict[str, int] = {}
        active = set(active)
        # Each topic's ends asked once: the versions of a store compare their lags
        # (foldstream.cluster.versions), which only means something against the same end.
        topic_ends: dict[str, dict[int, int]] = {}
        # Every topic's probe at once, all answered within one wait (their own threads).
        asked = {topic: ends.ask() for topic, ends in self.ends.items()}
        deadline = time.monotonic() + PROBE_WAIT_S
        for store, layout in self.stores.items():
            if self.versions is not None and self.versions.is_retired(store):
                continue
            topic = layout.source_topic
            copies = [p for t, p in active if t == topic]
            if not layout.follows_source:  # nothing to catch up on: no end to ask for
                lag.update({f"{store}/{p}": 0 for p in copies})
                continue
            if topic not in topic_ends:
                try:
                    topic_ends[topic] = self.ends[topic].ends(
                        timeout=max(0.0, deadline - time.monotonic()), asked=asked[topic]
                    )
                except Exception:  # noqa: BLE001 - ends not known yet: no lag to report
                    topic_ends[topic] = {}
            ends = topic_ends[topic]
            for p in copies:
                if p not in ends:
                    continue
                try:
                    applied = self._local.next_offset(store, p)
                    lag[f"{store}/{p}"] = self._source_lag(topic, p, applied, ends[p])
                except Exception:  # noqa: BLE001 - the broker or the copy did not answer: unknown
                    log.debug("lag of %s/%d unknown", store, p, exc_info=True)
        for store, p in self.replicas.held():
            standby_lag = self.replicas.lag(store, p)
            if standby_lag is not None:
                lag[f"{store}/{p}"] = standby_lag
        self._measured = (lag, {})
        return lag

    @property
    def last(self) -> dict[str, int]:
        """The lag :meth:`measure` found last."""
        return self._measured[0]

    def _source_lag(self, topic: str, partition: int, applied: int, end: int) -> int:
        """``end - applied``, or 0 when only offsets without records a reader is given lie
        between them (transaction markers, an aborted transaction's records: the end is the
        last stable offset, past both); a span found empty is remembered until the offsets
        move.

        Probing the span costs a consumer, so it is done only for a span that did not move
        since the last measurement: a projection at work moves it on every batch.
        """
        span = (applied, end)
        if end <= applied or self._empty_spans.get((topic, partition)) == span:
            return 0
        last, self._last_spans[(topic, partition)] = self._last_spans.get((topic, partition)), span
        if last != span:
            return end - applied
        if holds_records(self.bootstrap, topic, partition, applied, end, timeout=1.0):
            return end - applied
        self._empty_spans[(topic, partition)] = (applied, end)
        return 0

    def local(self, topic: str, partition: int, *, live: bool = False) -> int | None:
        """This instance's lag on ``partition`` of ``topic`` as last measured, or with ``live``
        the standby copies' lag right now where they have one."""
        if not live:
            measured, lags = self._measured
            try:
                return lags[(topic, partition)]
            except KeyError:
                found = lags[(topic, partition)] = partition_lag(
                    measured, self.counted(), topic, partition
                )
                return found
        lag = dict(self.last)
        counted = self.counted()
        for store, layout in counted.items():
            current = self.replicas.lag(store, partition)
            if layout.source_topic == topic and current is not None:
                lag[f"{store}/{partition}"] = current
        return partition_lag(lag, counted, topic, partition)

    def counted(self) -> Mapping[str, StoreLayout]:
        """The stores whose lag counts for their partitions' lag: the versions answering
        queries (:mod:`~foldstream.cluster.versions`)."""
        return self.stores if self.versions is None else self.versions.counted(self.stores)


def unmeasured(active: Iterable[str], lag: Mapping[str, int]) -> list[str]:
    """The ``active`` copies (``"<store>/<partition>"``) without a figure in ``lag``: their
    source partition's end is not known yet (:class:`~foldstream.end_probes.ProbedEnds` has
    had no answer yet), so nothing can be said about them being caught up."""
    return sorted(set(active) - lag.keys())


def partition_lag(
    lag: Mapping[str, int], stores: Mapping[str, StoreLayout], topic: str, partition: int
) -> int | None:
    """The largest lag (``lag`` maps ``"<store>/<partition>"``) among the stores of ``topic``
    at ``partition``; None unless every one of them has a figure. 0 for a topic no store reads
    (the events of a service whose stores all read other topics): nothing to copy."""
    lags = [
        lag.get(f"{store}/{partition}")
        for store, layout in stores.items()
        if layout.source_topic == topic
    ]
    if not lags:
        return 0
    if any(value is None for value in lags):
        return None
    return max(value for value in lags if value is not None)
