"""The physical stores an instance keeps, shared by every part that needs their layouts.

A store is added while the instance runs (a rebuild generation,
:mod:`foldstream.cluster.rebuilds`), never removed (a retired one stays listed, marked
retired). The parts holding per-store state (the store host's and the local readers' formats,
the standby copies, the takeovers, the lag meter, the version switch) hold this catalog rather
than a copy of it: they see a store as soon as it is added. Its mapping is replaced whole on
each addition and never changed in place, so a reader in another thread iterates one consistent
version of it without a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterator, Mapping

from foldstream.changelog.layout import StoreLayout


class StoreCatalog(Mapping[str, StoreLayout]):
    """``{physical store name: layout}``, copy-on-write (see the module)."""

    def __init__(self, layouts: Mapping[str, StoreLayout] | None = None) -> None:
        self._layouts: Mapping[str, StoreLayout] = dict(layouts or {})
        self._lock = threading.Lock()  # one addition at a time
        self.formats: Mapping[str, str] = _Formats(self)
        self.unmapped: Container[str] = _Unmapped(self)

    def snapshot(self) -> Mapping[str, StoreLayout]:
        """The stores as of now (a mapping nothing changes)."""
        return self._layouts

    def add(self, store: str, layout: StoreLayout) -> bool:
        """Add ``store`` (whether it was not there yet; a store is never replaced)."""
        with self._lock:
            if store in self._layouts:
                return False
            self._layouts = {**self._layouts, store: layout}
            return True

    def by_changelog(self, topic: str) -> str | None:
        """The store whose changelog is ``topic``."""
        for store, layout in self._layouts.items():
            if layout.changelog_topic == topic:
                return store
        return None

    def __getitem__(self, store: str) -> StoreLayout:
        return self._layouts[store]

    def __iter__(self) -> Iterator[str]:
        return iter(self._layouts)

    def __len__(self) -> int:
        return len(self._layouts)


class _Formats(Mapping[str, str]):
    """The on-disk format of each store of a catalog, as the catalog says now."""

    def __init__(self, catalog: StoreCatalog) -> None:
        self._catalog = catalog

    def __getitem__(self, store: str) -> str:
        return self._catalog.snapshot()[store].table_format

    def __iter__(self) -> Iterator[str]:
        return iter(self._catalog.snapshot())

    def __len__(self) -> int:
        return len(self._catalog.snapshot())


class _Unmapped(Container[str]):
    """The stores of a catalog whose files are read without ``mmap``, as the catalog says now."""

    def __init__(self, catalog: StoreCatalog) -> None:
        self._catalog = catalog

    def __contains__(self, store: object) -> bool:
        layout = self._catalog.snapshot().get(store) if isinstance(store, str) else None
        return layout is not None and not layout.mapped_reads
