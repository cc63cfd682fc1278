"""Whether a local copy of a store partition belongs to the topics it reads: the decision.

A copy records how far it got: the last source offset folded into it, the last changelog offset
it read, and the ids of its source and changelog topics (stamped since 2026-11; copies of an
earlier foldstream have none). Topics can change under a copy: a broker that keeps its data in
memory comes back empty, a topic is deleted and created again, a cluster is restored from a
backup, a state directory is moved to another cluster. The copy then holds values of records
that are not in its topics, and resuming from its positions would skip the new records.

:func:`judge` compares what a copy recorded with what the broker shows now (gathered by
:mod:`foldstream.stale_state`). A topic id unknown on either side (not stamped, a broker
without ids) is no evidence: the positions decide then.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recorded:
    """What a copy recorded: its last source and changelog offsets (None: none yet) and the
    ids of the topics it was built from (None: not stamped)."""

    source_offset: int | None = None
    changelog_offset: int | None = None
    source_id: str | None = None
    changelog_id: str | None = None

    @property
    def empty(self) -> bool:
        """Nothing folded or read yet: such a copy belongs to any topics."""
        return self.source_offset is None and self.changelog_offset is None

    def next_offsets(self) -> tuple[int | None, int | None]:
        """The next source and changelog offsets the copy would read (None: nothing to check),
        each of which must lie within its topic."""
        return tuple(  # type: ignore[return-value]
            None if offset is None else offset + 1
            for offset in (self.source_offset, self.changelog_offset)
        )


@dataclass(frozen=True)
class Observed:
    """What the broker shows of a copy's topics now: their ids (None: unknown) and whether the
    copy's next offsets lie within them (at or before each partition's end)."""

    source_id: str | None = None
    changelog_id: str | None = None
    source_offset_within: bool = True
    changelog_offset_within: bool = True


@dataclass(frozen=True)
class Verdict:
    """Why a copy does not belong to its topics, and where it is rebuilt from.

    ``changelog_whole`` is False when the source topic changed under the copy but its changelog
    did not: the changelog then holds values folded from the earlier source topic, which a
    rebuild must never apply (they are told apart by the source topic id each changelog record
    carries), and the copy is rebuilt from the source topic.
    """

    reasons: tuple[str, ...]
    changelog_whole: bool

    def __str__(self) -> str:
        return "; ".join(self.reasons)


def judge(
    recorded: Recorded, observed: Observed, *, source: str, changelog: str, partition: int
) -> Verdict | None:
    """None when the copy may be used as it is; otherwise why not (``source`` and
    ``changelog`` are the topics' names, for the reasons)."""
    if recorded.empty:
        return None
    source_reasons = _reasons(
        f"{source}/{partition}",
        recorded.source_id,
        observed.source_id,
        None if observed.source_offset_within else recorded.source_offset,
    )
    changelog_reasons = _reasons(
        f"{changelog}/{partition}",
        recorded.changelog_id,
        observed.changelog_id,
        None if observed.changelog_offset_within else recorded.changelog_offset,
    )
    if not source_reasons and not changelog_reasons:
        return None
    return Verdict(
        (*source_reasons, *changelog_reasons),
        changelog_whole=bool(changelog_reasons) or not source_reasons,
    )


def _reasons(
    where: str, stamped: str | None, current: str | None, past_end: int | None
) -> tuple[str, ...]:
    topic = where.rpartition("/")[0]
    reasons = []
    if stamped is not None and current is not None and stamped != current:
        reasons.append(
            f"topic {topic} is not the one the copy was built from (its id was {stamped}, it "
            f"is {current} now: created again, or on another cluster)"
        )
    if past_end is not None:
        reasons.append(f"{where} ends before offset {past_end}, which the copy had read")
    return tuple(reasons)
