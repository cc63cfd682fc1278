"""The inventory example with the command side of before the aggregate store: the reference of
the takeover figure (``bench/takeover.py``). Run as ``foldstream serve --service
bench.replay_serve:service``.

Importing this module makes the instance's command handler keep no snapshots
(``snapshots=None``, which :class:`~foldstream.commands.handler.CommandHandler` still
supports): every aggregate lives in memory and every takeover replays its partition from
offset 0. The aggregate store is still opened, restored and copied by the cluster, but stays
empty, so a takeover restores nothing from its changelog. Everything else is the example's.
"""

from __future__ import annotations

from typing import Any

import foldstream.instance
from foldstream.commands.handler import CommandHandler
from foldstream.examples.inventory import service

__all__ = ["service"]


class ReplayingCommandHandler(CommandHandler):
    """A command handler without an aggregate store, whatever the instance hands it."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**{**settings, "snapshots": None})


# The instance looks the class up when it opens its command side (after loading the service).
foldstream.instance.CommandHandler = ReplayingCommandHandler  # type: ignore[misc]
