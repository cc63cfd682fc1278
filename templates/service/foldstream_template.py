"""Jinja extension of the service template: where foldstream comes from, for the service.

Globals it adds:

- ``foldstream_default_url``: the default ``foldstream_url`` answer. From a foldstream checkout
  (the template beside its ``pyproject.toml``): that checkout's ``file://`` URL. From an
  installed foldstream: where it was installed from (its ``direct_url.json``: a wheel file, a
  directory, ``git+https://...@commit``), or ``""`` when it came from a package index (the
  service then requires ``foldstream==<version>``).
- ``foldstream_version``: the installed foldstream's version.
- ``foldstream_checkout``: the checkout's path, ``""`` when the template came in a package.
- ``foldstream_repository``: the ``Repository`` (or ``Source``) URL of foldstream's package
  metadata, ``""`` if it has none: where ``cruft update`` finds the template when nothing
  better is known (see ``hooks/post_gen_project.py``).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from jinja2 import Environment
from jinja2.ext import Extension

TEMPLATE = Path(__file__).resolve().parent


def checkout() -> Path | None:
    """The foldstream repository holding this template, if it is in one."""
    root = TEMPLATE.parents[1]
    project = root / "pyproject.toml"
    if project.is_file() and 'name = "foldstream"' in project.read_text():
        return root
    return None


def _distribution() -> metadata.Distribution | None:
    try:
        return metadata.distribution("foldstream")
    except metadata.PackageNotFoundError:
        return None


def installed_from(distribution: metadata.Distribution | None) -> str:
    """Where pip installed foldstream from (PEP 610), as a requirement URL; "" for an index."""
    text = distribution.read_text("direct_url.json") if distribution else None
    if not text:
        return ""
    origin = json.loads(text)
    vcs = origin.get("vcs_info")
    if vcs:
        return f"{vcs['vcs']}+{origin['url']}@{vcs['commit_id']}"
    return str(origin.get("url", ""))


def repository(distribution: metadata.Distribution | None) -> str:
    entries = (distribution.metadata.get_all("Project-URL") if distribution else None) or []
    for entry in entries:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("repository", "source", "source code"):
            return url.strip()
    return ""


class CheckoutExtension(Extension):
    """Adds the globals above to the template's Jinja environment."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        root = checkout()
        distribution = _distribution()
        environment.globals.update(
            foldstream_default_url=root.as_uri() if root else installed_from(distribution),
            foldstream_version=distribution.version if distribution else "0",
            foldstream_checkout=str(root) if root else "",
            foldstream_repository=repository(distribution),
        )
