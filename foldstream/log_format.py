"""How an instance logs: text lines by default, JSON objects with ``FOLDSTREAM_LOG_FORMAT=json``.

A JSON line holds ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message`` and, when there
is one, ``exception`` (the formatted traceback): one object per line, for log shippers. Only
Python's logging goes through it; the JVM's own output (Spark's log4j, warnings and errors
only) keeps log4j's format.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime

from foldstream.errors import ConfigurationError

FORMAT_ENV = "FOLDSTREAM_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_format() -> str:
    """``text`` or ``json``, from :data:`FORMAT_ENV`."""
    chosen = os.environ.get(FORMAT_ENV, "text").strip().lower() or "text"
    if chosen not in ("text", "json"):
        raise ConfigurationError(f"{FORMAT_ENV}={chosen!r}: use 'text' or 'json'")
    return chosen


def configure_logging() -> None:
    """Log to stderr at ``FOLDSTREAM_LOG_LEVEL`` (INFO) in the chosen format."""
    handler = logging.StreamHandler()
    if log_format() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(
        level=os.environ.get("FOLDSTREAM_LOG_LEVEL", "INFO"), handlers=[handler], force=True
    )
