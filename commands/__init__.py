"""The command side: load an aggregate, run a command method, append its events to Kafka."""

from __future__ import annotations

from foldstream.commands.handler import (
    AggregateUnreplayable,
    CommandHandler,
    CommandResult,
    InvalidArguments,
    UnknownCommand,
    VersionConflict,
)

__all__ = [
    "AggregateUnreplayable",
    "CommandHandler",
    "CommandResult",
    "InvalidArguments",
    "UnknownCommand",
    "VersionConflict",
]
