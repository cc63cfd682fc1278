"""The shapes of an instance's HTTP answers, as pydantic models.

``GET /openapi.json`` publishes their JSON schemas, and :mod:`foldstream.client` parses answers
with them. They describe what the routes send (built in :mod:`foldstream.query_api.answers`,
:mod:`foldstream.commands.http` and :mod:`foldstream.cluster.location`); they tolerate fields
added later (``extra="allow"``), so an older client keeps working with a newer instance.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ErrorAnswer(_Answer):
    """Every 4xx and 5xx answer: what went wrong, and for a 503 the partition concerned."""

    error: str
    partition: int | None = None


class VersionConflictAnswer(ErrorAnswer):
    """409: the aggregate is not at the version the command expected."""

    expected_version: int
    current_version: int


class ServedBy(_Answer):
    """Which instance answered a lookup, from which copy of the key's partition."""

    instance: str
    role: Literal["active", "standby", "unconfirmed"] = Field(
        description="unconfirmed: the active copy of an instance whose view of the cluster is "
        "not current (it may have been replaced meanwhile), served only to max_lag=any"
    )
    partition: int
    lag: int | None = Field(description="records the copy lacks, when known")


class LookupAnswer(_Answer):
    """200 of ``GET /stores/{store}/keys/{key}``: the stored value (any JSON)."""

    key: str
    value: Any
    served_by: ServedBy


class RangeEntry(_Answer):
    sort_key: Any = Field(description="an ISO-8601 UTC time, an integer or a string")
    value: Any


class RangeAnswer(_Answer):
    """``GET /stores/{store}/keys/{key}/range``: a page of the key's entries, in sort key
    order; ``next`` (sent back as ``after``) reads the next page, null on the last."""

    key: str
    entries: list[RangeEntry]
    next: str | None
    served_by: ServedBy


class Window(_Answer):
    start: str = Field(description="ISO-8601 UTC, inclusive")
    end: str = Field(description="ISO-8601 UTC, exclusive")
    value: Any


class WindowsAnswer(_Answer):
    """``GET /stores/{store}/keys/{key}/windows``: a page of the key's windows, oldest first;
    ``next`` (sent back as ``after``) reads the next page, null on the last."""

    key: str
    windows: list[Window]
    next: str | None
    served_by: ServedBy


class MissingKeyAnswer(ErrorAnswer):
    """404 of a lookup of a key the store does not hold (``served_by`` is the owner's copy)."""

    served_by: ServedBy | None = None


class BatchAnswer(_Answer):
    """200 of ``POST /stores/{store}/keys``: the values this instance holds, the keys it does
    not hold (``missing``), the keys other instances own by their URL (``elsewhere``: send them
    there) and the keys nobody can answer right now (``unavailable``: retry)."""

    values: dict[str, Any]
    missing: list[str]
    elsewhere: dict[str, list[str]]
    unavailable: list[str]


class CommandEvent(_Answer):
    """One event a command appended: its type, its version and its own fields."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str
    version: int


class Position(_Answer):
    """Where the command's last event landed in the events topic."""

    partition: int
    offset: int


class CommandAnswer(_Answer):
    """200 of a command: the events it appended, where the last one landed, and the
    consistency token of that position (send it back with a query,
    ``?consistent_with=TOKEN``, to read state that includes this command)."""

    events: list[CommandEvent]
    position: Position
    token: str


class StoreVersion(_Answer):
    """One version of a store's fold (``docs/concepts/versions.md``), with its progress over its
    source topic's offsets, summed over partitions (null: not known yet)."""

    version: int
    state: Literal["serving", "building", "replaced", "retired"] = Field(
        description="serving: answers the store's queries; building: newer, not caught up "
        "yet; replaced: older, folded until every instance answers with a newer one; "
        "retired: its topics and directories are gone"
    )
    folded: int | None = Field(default=None, description="offsets its active copies folded")
    behind: int | None = Field(default=None, description="offsets they have still to fold")
    total: int | None = Field(default=None, description="the source topic's end offsets")
    generation: int = Field(
        default=0,
        description="0: the version as first built; else its rebuild generation (`foldstream "
        "rebuild`), ranked after the version and its earlier generations",
    )


class RebuildAnswer(_Answer):
    """202 of ``POST /stores/{store}/rebuilds``: the generation every instance builds now
    beside the one answering (follow it with ``foldstream versions URL STORE``)."""

    store: str
    version: int = Field(description="the version rebuilt: the one answering when asked")
    generation: int = Field(description="the new generation's number")


class StoreEntry(_Answer):
    name: str
    partitions: int
    partitioner: Literal["murmur2", "consistent"]
    kind: Literal["point", "ordered", "windowed"] = Field(
        default="point",
        description="point: key lookups; ordered: ranges of a key's entries; windowed: a "
        "key's windows",
    )
    version: int = Field(default=1, description="the version answering the store's queries")
    generation: int = Field(
        default=0, description="the rebuild generation of that version answering (0: none)"
    )
    versions: list[StoreVersion] = Field(default_factory=list)


class StoresAnswer(_Answer):
    """``GET /stores``: each store with its partition count and its source's partitioner."""

    stores: list[StoreEntry]


class StandbyCopy(_Answer):
    url: str
    lag: int | None
    suspect: bool = Field(default=False, description="its instance is a suspect: not asked")


class PartitionOwners(_Answer):
    """Who answers for one partition: the active owner's URL (None while nobody owns it, or
    while its owner is a suspect, then named by ``suspect``) and the instances keeping standby
    copies, with how many records each lacks."""

    active: str | None
    suspect: str | None = Field(
        default=None,
        description="the owner's URL while it is a suspect (its heartbeats are late: it may be "
        "dead): no request is sent there",
    )
    standbys: list[StandbyCopy]


class OwnersAnswer(PartitionOwners):
    """``GET /stores/{store}/owners/{key}``: the key's partition and who answers for it."""

    store: str
    key: str
    partition: int


class Member(_Answer):
    """A live instance as it describes itself on the cluster topic."""

    id: str
    url: str
    epoch: int = 0
    generation: int = 0
    leader: str = ""
    active: dict[str, list[int]] = Field(default_factory=dict)
    restoring: dict[str, list[int]] = Field(default_factory=dict)
    standby: dict[str, list[int]] = Field(default_factory=dict)
    lag: dict[str, int] = Field(default_factory=dict, description='"<store>/<partition>": lag')
    last_seen_s: float = 0.0
    suspect: bool = Field(
        default=False,
        description="its heartbeats are late (it may be dead): no request is sent to it until it "
        "beats again or the session timeout drops it",
    )


class StoreLayout(_Answer):
    topic: str
    partitions: int
    partitioner: Literal["murmur2", "consistent"]


class CommandLayout(_Answer):
    """The events topic commands are appended to (a command goes to its aggregate id's
    partition's owner), and how long a command's ``Idempotency-Key`` is remembered at least
    (null: the instances do not honour the header)."""

    topic: str
    partitions: int
    idempotency_retention_s: float | None = None


class ClusterMap(_Answer):
    """``GET /cluster``: the members, each partition's active and standby URLs, the stores'
    source topics, and whether the assignment has settled (no partition waiting to move)."""

    generation: int
    leader: str | None = None
    settled: bool
    view_current: bool = Field(
        default=True,
        description="false while the instance answering has not read its own heartbeat back "
        "within the session timeout: this map may be out of date",
    )
    instances: list[Member]
    partitions: dict[str, dict[str, PartitionOwners]] = Field(
        description="topic -> partition number (as a string) -> owners"
    )
    stores: dict[str, StoreLayout]
    commands: CommandLayout | None = None


class Readiness(_Answer):
    """``GET /ready``: 200 when this instance serves everything it owns, caught up; 503 with
    the ``reason`` when not."""

    ready: bool
    reason: str | None = None
    instance: str | None = None
    lag: dict[str, int] | None = None
