"""The records instances write to the cluster topic, checked on the way in.

Whoever can write to ``<service>.cluster`` can write anything there, so every record read from it
is untrusted input: it is parsed with strict types (integers are JSON integers, never floats or
strings) and bounds (ids, topic names and URLs of bounded length and alphabet, URLs ``http`` or
``https`` without whitespace or control characters, integers below 2**63), and a record that
does not pass is logged, counted and ignored. A valid record can still lie: keep write access to
the topic to the service's instances (Kafka ACLs), as for the events topic itself.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from foldstream.cluster.assignment import Assignment
from foldstream.settings import valid_url

#: A record larger than this is not parsed at all.
MAX_RECORD_BYTES = 1 << 20
#: Epochs, generations and lags: JSON numbers every client reads exactly.
MAX_COUNT = 2**53 - 1
MAX_ENTRIES = 100_000


def _checked_url(url: str) -> str:
    if not valid_url(url):
        raise ValueError("not an http(s) URL without user info, whitespace or control characters")
    return url


MemberId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
TopicName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
StoreName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PartitionNumber = Annotated[int, Field(ge=0, le=MAX_ENTRIES)]
PartitionKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,6}$")]
LagKey = Annotated[str, StringConstraints(pattern=r"^[^/\x00-\x1f\x7f]{1,249}/[0-9]{1,6}$")]
Url = Annotated[str, AfterValidator(_checked_url)]
Partitions = Annotated[
    dict[TopicName, Annotated[list[PartitionNumber], Field(max_length=MAX_ENTRIES)]],
    Field(max_length=1000),
]


class InvalidRecord(ValueError):
    """A cluster record that does not parse or breaks a bound; it is ignored."""


class MemberState(BaseModel):
    """What one instance publishes about itself.

    ``active`` and ``standby`` map a source topic to partitions; ``lag`` maps
    ``"<store>/<partition>"`` to records not yet applied (source records for an active copy,
    changelog records for a standby); ``serving`` and ``retired`` say which versions of a
    store with several it answers with and has retired (:mod:`.versions`). ``generation`` and
    ``leader`` name the newest assignment
    the member has applied: it has released every partition that assignment does not give it.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    id: MemberId
    url: Url
    epoch: Count = 0
    generation: Count = 0
    leader: Annotated[str, StringConstraints(max_length=128)] = ""
    beat: Annotated[int, Field(ge=0, lt=2**63)] = 0  # set by ClusterMap.publish
    active: Partitions = Field(default_factory=dict)
    restoring: Partitions = Field(default_factory=dict)
    standby: Partitions = Field(default_factory=dict)
    lag: Annotated[dict[LagKey, Count], Field(max_length=MAX_ENTRIES)] = Field(default_factory=dict)
    #: The version each store with several versions answers with (:mod:`.versions`).
    serving: Annotated[dict[StoreName, Count], Field(max_length=1000)] = Field(default_factory=dict)
    #: The store versions this member has retired.
    retired: Annotated[list[StoreName], Field(max_length=1000)] = Field(default_factory=list)
    #: The rebuild generation of the version in ``serving`` (:mod:`.rebuilds`), when not 0.
    generations: Annotated[dict[StoreName, Count], Field(max_length=1000)] = Field(
        default_factory=dict
    )

    @property
    def applied(self) -> tuple[int, str]:
        """The identity of the assignment this member has applied."""
        return self.generation, self.leader

    def same_as(self, other: MemberState | None) -> bool:
        """Equal but for the heartbeat number."""
        return other is not None and self.model_dump(exclude={"beat"}) == other.model_dump(
            exclude={"beat"}
        )

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MemberState:
        """The state in ``raw``; :class:`InvalidRecord` when it is not a valid one."""
        return _parse(cls, raw)


class _AssignmentRecord(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    generation: Annotated[int, Field(ge=1, le=MAX_COUNT)]
    leader: MemberId
    active: dict[TopicName, dict[PartitionKey, MemberId]] = Field(default_factory=dict)
    standby: dict[TopicName, dict[PartitionKey, list[MemberId]]] = Field(default_factory=dict)
    warmups: dict[TopicName, dict[PartitionKey, MemberId]] = Field(default_factory=dict)
    members: Annotated[list[MemberId], Field(max_length=10_000)] = Field(default_factory=list)


class RebuildRequest(BaseModel):
    """A request to rebuild ``version`` of ``store`` (a declared name) as ``generation``
    (:mod:`.rebuilds`), kept in the cluster topic under :func:`rebuild_key`."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    store: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,200}$")]
    version: Annotated[int, Field(ge=1, le=9999)]
    generation: Annotated[int, Field(ge=1, le=9999)]

    @classmethod
    def from_record(cls, key: bytes, raw: bytes | None) -> RebuildRequest:
        """The request in a record; :class:`InvalidRecord` when it is not a valid one, or not
        the one its key names."""
        request = _parse(cls, raw)
        if key != rebuild_key(request.store):
            raise InvalidRecord(f"rebuild of {request.store!r} under another store's key")
        return request  # type: ignore[no-any-return]


#: Cluster topic keys of rebuild requests start with this (member ids start with a letter or a
#: digit).
REBUILD_PREFIX = b"__rebuild__/"


def rebuild_key(store: str) -> bytes:
    return REBUILD_PREFIX + store.encode()


def parse_assignment(raw: bytes | None) -> Assignment:
    """The assignment in ``raw``; :class:`InvalidRecord` when it is not a valid one."""
    record = _parse(_AssignmentRecord, raw)
    return Assignment(**record.model_dump())


def _parse(model: type[Any], raw: bytes | None) -> Any:
    if raw is None:
        raise InvalidRecord("no value")
    if len(raw) > MAX_RECORD_BYTES:
        raise InvalidRecord(f"{len(raw)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "record"
        raise InvalidRecord(f"{where}: {first.get('msg', 'invalid')}") from None
