"""Where the client sends each request: the cluster map (``GET /cluster``) it keeps.

A key's partition is computed as the instances compute it (:func:`foldstream.kafka.
partition_for`, with the store's partitioner), and its active owner's URL read from the map.
Requests go to the owner directly, without a redirect, until the map turns stale: a 307, a 503
or an unreachable instance marks it so and it is read again before the next request. Nothing is
sent to a suspect (a member whose heartbeats are late: it may be dead) while another instance
is known: the map names no owner for its partitions, and it is asked last.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from foldstream.api_models import ClusterMap
from foldstream.kafka import partition_for

#: How long an instance that refused a connection is tried last.
DOWN_FOR_S = 5.0


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class Router:
    """The cluster map as the client last read it, and the instances it knows.

    ``seeds``: the URLs the client was given (any instances of the cluster). Members the map
    lists are added to them; an instance that could not be reached is tried last for
    :data:`DOWN_FOR_S`. Without ``route``, no owner is ever known: every request goes to the
    first seed that answers (a load balancer, say) and its redirects are followed.
    """

    def __init__(self, seeds: Sequence[str], *, route: bool = True) -> None:
        if not seeds:
            raise ValueError("give at least one instance URL")
        self.seeds = [url.rstrip("/") for url in seeds]
        self.route = route
        self.map: ClusterMap | None = None
        self.stale = True
        self.read_at = 0.0
        self._down: dict[str, float] = {}

    def update(self, cluster: ClusterMap) -> None:
        self.map = cluster
        self.stale = False
        self.read_at = time.monotonic()

    def mark_down(self, url: str) -> None:
        """``url`` refused a connection: try it last for a while, and read the map again."""
        self._down[origin(url)] = time.monotonic()
        self.stale = True

    def _is_down(self, url: str) -> bool:
        since = self._down.get(origin(url))
        return since is not None and time.monotonic() - since < DOWN_FOR_S

    def instances(self) -> list[str]:
        """Every instance known, the ones recently down last (the seeds first when not
        routing, else the members of the map)."""
        members = [m.url.rstrip("/") for m in self.map.instances] if self.map else []
        order = [*members, *self.seeds] if self.route else [*self.seeds, *members]
        known = list(dict.fromkeys(order))
        # Stable: the order is kept otherwise.
        return sorted(known, key=lambda url: (self._is_down(url), self._is_suspect(url)))

    def _is_suspect(self, url: str) -> bool:
        """Whether the map says the member at ``url`` is a suspect."""
        members = self.map.instances if self.map else []
        return any(m.suspect and origin(m.url) == origin(url) for m in members)

    def any_instance(self) -> str:
        return self.instances()[0]

    def is_member(self, url: str) -> bool:
        """Whether ``url`` is on an instance the client knows (credentials go only there)."""
        return origin(url) in {origin(u) for u in self.instances()}

    def store_owner(self, store: str, key: str) -> str | None:
        """The URL of the instance serving ``key``'s partition of ``store`` (None: unknown)."""
        if self.map is None or store not in self.map.stores:
            return None
        layout = self.map.stores[store]
        partition = partition_for(key.encode(), layout.partitions, layout.partitioner)
        return self._active(layout.topic, partition)

    def command_owner(self, aggregate_id: str) -> str | None:
        """The URL of the instance taking commands for ``aggregate_id`` (None: unknown)."""
        if self.map is None or self.map.commands is None:
            return None
        layout = self.map.commands
        return self._active(layout.topic, partition_for(aggregate_id.encode(), layout.partitions))

    def _active(self, topic: str, partition: int) -> str | None:
        assert self.map is not None
        if not self.route:
            return None
        owners = self.map.partitions.get(topic, {}).get(str(partition))
        if owners is None or owners.active is None:
            return None  # nobody owns it now, or its owner is a suspect
        if self._is_down(owners.active) or self._is_suspect(owners.active):
            return None
        return owners.active.rstrip("/")
