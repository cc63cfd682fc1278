"""What is left of a retired store version, and its removal (:mod:`.versions` decides when).

A retired version's folding stops (its query, or its part of a shared one), its copies are
released and their directories deleted, and a marker file under the state directory
(``retired/<store>``) keeps it retired across restarts: its topics are not created again and
its query does not start. The leader deletes its changelog
and dead-letter topics once every live member lists it as retired.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path

from foldstream.cluster.records import MemberState
from foldstream.kafka_client import admin_client
from foldstream.kafka_topics import topic_partitions
from foldstream.settings import Settings

log = logging.getLogger(__name__)

#: Under the state directory: one empty file per retired store version.
RETIRED_DIR = "retired"
#: How often the leader looks for topics of retired versions (a member started with an empty
#: state directory creates them again before it learns they are retired).
TOPICS_CHECK_S = 60.0


def retired_stores(state_dir: Path) -> frozenset[str]:
    """The store versions retired in ``state_dir`` (by this run or one before)."""
    marked = Path(state_dir) / RETIRED_DIR
    if not marked.is_dir():
        return frozenset()
    return frozenset(path.name for path in marked.iterdir())


class RetiredMarks:
    """The retired versions among ``stores``, kept as marker files in ``state_dir``."""

    def __init__(self, state_dir: Path, stores: Collection[str]) -> None:
        self.state_dir = Path(state_dir)
        self._retired = frozenset(s for s in retired_stores(self.state_dir) if s in stores)
        self._lock = threading.Lock()

    def is_retired(self, store: str) -> bool:
        return store in self._retired

    def is_marked(self, store: str) -> bool:
        """Whether ``store`` has a retired marker in the state directory, also when it was
        not among ``stores`` at start (a rebuild generation retired by an earlier run)."""
        return store in self._retired or (self.state_dir / RETIRED_DIR / store).exists()

    def retired(self) -> frozenset[str]:
        return self._retired

    def retire(self, store: str) -> None:
        """Mark ``store`` retired, here and in the state directory."""
        marker = self.state_dir / RETIRED_DIR / store
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        with self._lock:
            self._retired = self._retired | {store}
        log.info("store version %s retired: its copies and directories go", store)

    def delete_directories(self, busy: Collection[tuple[str, int]]) -> None:
        """Delete the state of every retired store of which no copy is ``busy`` (held, or
        being restored: left for the next call)."""
        for store in self._retired:
            path = self.state_dir / "stores" / store
            if path.exists() and not any(s == store for s, _ in busy):
                shutil.rmtree(path, ignore_errors=True)
                log.info("deleted the state of retired store version %s", store)


class RetiredTopics:
    """The leader's part: deleting the changelog and dead-letter topics of the store versions
    every live member has retired (with ``create_topics`` false, asking the operator to)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._next_check = 0.0

    def delete(self, members: Mapping[str, MemberState], retired_here: Collection[str]) -> None:
        """Delete what is left of the topics of the versions every live member lists as
        retired, this one's (``retired_here``) among them, once per :data:`TOPICS_CHECK_S`."""
        retired = set(retired_here).intersection(*(m.retired for m in members.values()))
        now = time.monotonic()
        if not retired or now < self._next_check:
            return
        self._next_check = now + TOPICS_CHECK_S
        settings = self.settings
        admin = admin_client(settings.bootstrap_servers)  # held until the futures are done
        topics = [
            topic
            for store in sorted(retired)
            for topic in (settings.changelog_topic(store), settings.dead_letter_topic(store))
            if topic_partitions(admin, topic) is not None
        ]
        if not topics:
            return
        if not settings.create_topics:
            log.warning(
                "the topics %s belong to retired store versions: delete them (this instance "
                "creates and deletes no topics: create_topics is false)",
                topics,
            )
            return
        for topic, future in admin.delete_topics(topics, operation_timeout=10).items():
            try:
                future.result(timeout=15)
                log.info("deleted topic %s of a retired store version", topic)
            except Exception as exc:  # noqa: BLE001 - tried again at the next check
                log.warning(
                    "deleting topic %s of a retired store version failed (%s); trying again "
                    "in %.0fs (check that the instance's Kafka principal may delete it)",
                    topic,
                    exc,
                    TOPICS_CHECK_S,
                )
