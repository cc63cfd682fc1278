"""This member's heartbeat: its state published to the cluster topic every half second (and
at every change, :meth:`ClusterMap.publish`), and the notice that this process stood still."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from foldstream.cluster.map import ClusterMap
from foldstream.cluster.records import MemberState
from foldstream.settings import HEARTBEAT_INTERVAL_MS

log = logging.getLogger(__name__)


class Heartbeat:
    """Publishes ``state()`` every ``interval_s`` (and notices when this process stood still).

    A late heartbeat makes the others think this member is dead, so the thread does nothing
    else. ``on_pause(seconds)`` is called when the process stood still for longer than the
    session timeout (a long pause, a frozen machine): the others may have taken its partitions
    over meanwhile.
    """

    def __init__(
        self,
        cluster_map: ClusterMap,
        state: Callable[[], MemberState],
        *,
        on_pause: Callable[[float], None],
        interval_s: float = HEARTBEAT_INTERVAL_MS / 1000,
        tick_s: float = 0.1,
    ) -> None:
        self._map = cluster_map
        self._state = state
        self._on_pause = on_pause
        self.interval_s = interval_s
        self.tick_s = tick_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cluster-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last = 0.0
        awake = time.monotonic()
        while not self._stopping.wait(self.tick_s):
            now = time.monotonic()
            if now - awake > self._map.liveness_s:
                self._on_pause(now - awake)
            awake = now
            if now - last < self.interval_s:
                continue
            try:
                self._map.publish(self._state())
                last = now
            except Exception:  # noqa: BLE001 - the next beat tries again
                log.exception("cluster heartbeat failed")

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
