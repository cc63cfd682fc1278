"""Versions of a store: a changed fold built beside the one that answers today.

A projection declares ``version=N`` (1 when it says nothing). Version 1 keeps the store's own
name; version N > 1 lives under ``<store>.vN``: its own state directories, changelog and
dead-letter topics (store names cannot hold a dot, so no declared store can take the name). A
service may declare several versions of one store at once: each is folded, and queries of the
store are answered by the newest version that has caught up (:mod:`foldstream.cluster.versions`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from foldstream.errors import ConfigurationError
from foldstream.projections.graph import is_hidden
from foldstream.projections.joins import Join
from foldstream.projections.projection import Projection

#: Versions run from 1 to this.
MAX_VERSION = 9999
#: Rebuild generations of a version run from 1 to this (0: the version as first built).
MAX_GENERATION = 9999
_MARK = ".v"
#: A rebuild generation's name: ``<store>.vN.rG`` (``stock.v1.r2``).
_GENERATION = re.compile(r"^(?P<version>.+\.v[1-9][0-9]{0,3})\.r(?P<generation>[1-9][0-9]{0,3})$")


def versioned_name(store: str, version: int) -> str:
    """The name the state and topics of ``version`` of ``store`` go by."""
    return store if version == 1 else f"{store}{_MARK}{version}"


def generation_name(store: str, version: int, generation: int) -> str:
    """The name of rebuild ``generation`` of ``version`` of ``store`` (generation 0: the
    version's own name). Ordered after the version's own name and before the next version's
    (:func:`rank`)."""
    if generation == 0:
        return versioned_name(store, version)
    return f"{store}{_MARK}{version}.r{generation}"


def generation_of(store: str) -> int:
    """The rebuild generation a store's name says (0 for a name without one)."""
    found = _GENERATION.match(store)
    return 0 if found is None else int(found["generation"])


def version_name(store: str) -> str:
    """The name of the version a generation rebuilds (``stock.v1.r2`` -> ``stock``,
    ``stock.v2.r1`` -> ``stock.v2``); other names as they are."""
    found = _GENERATION.match(store)
    if found is None:
        return store
    return versioned_name(logical_name(found["version"]), version_of(found["version"]))


def rank(store: str) -> tuple[int, int]:
    """``(version, generation)`` of a store's name: newer versions and generations rank
    higher."""
    return version_of(store), generation_of(store)


def logical_name(store: str) -> str:
    """The store a versioned name belongs to (``stock.v2`` -> ``stock``, ``stock.v1.r2`` ->
    ``stock``); other names as they are."""
    found = _GENERATION.match(store)
    if found is not None:
        store = found["version"]
    base, mark, number = store.rpartition(_MARK)
    if mark and base and number.isdigit() and not number.startswith("0"):
        return base
    return store


def version_of(store: str) -> int:
    """The version a store's name says (1 for a name without one)."""
    found = _GENERATION.match(store)
    if found is not None:
        store = found["version"]
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
    if generation_of(projection.store) and version_of(projection.store) == version:
        return logical_name(projection.store)  # a rebuild generation's
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


def rebuild_refusal(projections: Sequence[Projection], store: str) -> str | None:
    """Why ``store`` (a physical name among ``projections``) cannot be rebuilt beside itself,
    naming the remedy; None when it can. The stores versions refuse are refused: a store other
    stores read, a re-keyed store, a join (and the hidden stores behind them)."""
    read = {name for p in projections if isinstance(p, Join) for name in p.upstream()}
    found = [p for p in projections if p.store == store]
    if not found:
        return f"no store named {store!r}"
    if logical_name(store) in read or store in read:
        return (
            f"store {logical_name(store)!r} is read by other stores (Changes): it cannot be "
            "rebuilt beside itself; declare the stores reading it anew under new names instead"
        )
    if isinstance(found[0], Join) or is_hidden(found[0]):
        return (
            f"store {logical_name(store)!r} is re-keyed or a join: it cannot be rebuilt beside "
            "itself; declare its fold under a new store name instead"
        )
    return None
