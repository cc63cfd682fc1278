"""Versions of a store: a changed fold built beside the one that answers today.

A projection declares ``version=N`` (1 when it says nothing). Version 1 keeps the store's own
name; version N > 1 lives under ``<store>.vN``: its own state directories, changelog and
dead-letter topics (store names cannot hold a dot, so no declared store can take the name). A
service may declare several versions of one store at once: each is folded, and queries of the
store are answered by the newest version that has caught up (:mod:`foldstream.cluster.versions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from foldstream.errors import ConfigurationError
from foldstream.projections.joins import Join
from foldstream.projections.projection import Projection

#: Versions run from 1 to this.
MAX_VERSION = 9999
_MARK = ".v"


def versioned_name(store: str, version: int) -> str:
    """The name the state and topics of ``version`` of ``store`` go by."""
    return store if version == 1 else f"{store}{_MARK}{version}"


def logical_name(store: str) -> str:
    """The store a versioned name belongs to (``stock.v2`` -> ``stock``); other names as
    they are."""
    base, mark, number = store.rpartition(_MARK)
    if mark and base and number.isdigit() and not number.startswith("0"):
        return base
    return store


def version_of(store: str) -> int:
    """The version a store's name says (1 for a name without one)."""
    base = logical_name(store)
    return 1 if base == store else int(store[len(base) + len(_MARK) :])


def check_version(projection: Projection) -> str:
    """The declared name of ``projection``'s store (its name without the version mark);
    :class:`ConfigurationError` for a version out of range."""
    version = projection.version
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigurationError(
            f"store {projection.store!r}: version must be an int, not {version!r}"
        )
    if not 1 <= version <= MAX_VERSION:
        raise ConfigurationError(
            f"store {projection.store!r}: version must be 1 to {MAX_VERSION}, not {version}"
        )
    suffix = f"{_MARK}{version}"
    if version > 1 and projection.store.endswith(suffix):
        return projection.store[: -len(suffix)]
    return projection.store


def named_by_version(projection: Projection) -> Projection:
    """``projection`` under its version's name."""
    name = versioned_name(logical_name(projection.store), projection.version)
    if name == projection.store:
        return projection
    return dataclasses.replace(projection, store=name)  # type: ignore[type-var]


def check_versions(projections: Sequence[Projection]) -> None:
    """A service's versions must be distinct per store, of one kind, and of stores no other
    store reads (:class:`ConfigurationError` naming the remedy)."""
    read = {name for p in projections if isinstance(p, Join) for name in p.upstream()}
    kinds: dict[str, tuple[str, str]] = {}
    versions: dict[str, list[int]] = {}
    for projection in projections:
        store = logical_name(projection.store)
        if versions.setdefault(store, []) and projection.version in versions[store]:
            raise ConfigurationError(
                f"store {store!r} declares version {projection.version} twice: give the new "
                "fold the next version"
            )
        versions[store].append(projection.version)
        shape = (projection.kind, projection.partitioner)
        if kinds.setdefault(store, shape) != shape:
            raise ConfigurationError(
                f"the versions of store {store!r} differ in kind or partitioner ({kinds[store]} "
                f"and {shape}): a store of another kind or partitioning needs another name"
            )
    for store, declared in versions.items():
        if (len(declared) > 1 or max(declared) > 1) and store in read:
            raise ConfigurationError(
                f"store {store!r} has versions and other stores read its changes: "
                "versions are supported for stores no other store reads; give the new "
                "fold a new store name instead"
            )
