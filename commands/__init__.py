"""The command side: load an aggregate, run a command method, append its events to Kafka."""

from __future__ import annotations

from foldstream.commands.arguments import CommandArguments, InvalidArguments, command_arguments
from foldstream.commands.handler import CommandHandler
from foldstream.commands.idempotency import IdempotencyKeyReused
from foldstream.commands.key_entries import Retention
from foldstream.commands.outcomes import CommandResult, UnknownCommand, VersionConflict
from foldstream.commands.unreplayable import AggregateUnreplayable

__all__ = [
    "AggregateUnreplayable",
    "CommandArguments",
    "CommandHandler",
    "CommandResult",
    "IdempotencyKeyReused",
    "InvalidArguments",
    "Retention",
    "UnknownCommand",
    "VersionConflict",
    "command_arguments",
]
