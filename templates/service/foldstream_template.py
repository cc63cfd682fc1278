"""Jinja extension of the service template: where the foldstream checkout holding it is.

``foldstream_root`` (a path) and ``foldstream_root_url`` (its ``file://`` URL) are the default
source of the generated service's ``foldstream`` requirement and of its venv bootstrap script.
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment
from jinja2.ext import Extension

ROOT = Path(__file__).resolve().parents[2]


class CheckoutExtension(Extension):
    """Adds ``foldstream_root`` and ``foldstream_root_url`` to the template's globals."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.globals["foldstream_root"] = str(ROOT)
        environment.globals["foldstream_root_url"] = ROOT.as_uri()
