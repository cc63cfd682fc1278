"""Finish a generated service: ``.cruft.json``, for ``cruft update`` to bring template changes.

It records the answers and where the template is, as a location another machine can use: the
git repository of a ``git+https://`` foldstream URL (at its ref), else the ``origin`` remote of
the foldstream checkout the template came from, else the repository URL in foldstream's package
metadata. When none is known it records the local template path and says so.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

URL = {{ cookiecutter.foldstream_url | tojson }}
CHECKOUT = {{ foldstream_checkout | tojson }}
PACKAGE_REPOSITORY = {{ foldstream_repository | tojson }}
CONTEXT = json.loads({{ cookiecutter | jsonify | tojson }})
TEMPLATE_DIRECTORY = "templates/service"  # in the foldstream repository


def git(*args: str) -> str | None:
    if not CHECKOUT:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", CHECKOUT, *args], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def template_location() -> tuple[str | None, str | None]:
    """``(repository URL, ref)`` of the template, or ``(None, None)`` when none is known."""
    match = re.fullmatch(r"git\+(https?://[^@#]+?)(?:@([^#]+))?(?:#.*)?", URL)
    if match:
        return match.group(1), match.group(2)
    origin = git("remote", "get-url", "origin")
    if origin:
        return origin, None
    if PACKAGE_REPOSITORY:
        return PACKAGE_REPOSITORY, None
    return None, None


# cruft passes "_commit" and keeps .cruft.json itself: writing one into its renders would
# show up in the diff that `cruft update` applies.
if "_commit" not in CONTEXT:
    repository, ref = template_location()
    if repository is None:
        repository = CHECKOUT or str(Path(CONTEXT.get("_template", ".")).resolve())
        print(
            f"warning: .cruft.json points at {repository}, on this machine only: foldstream's "
            "repository URL is unknown (no git+https:// foldstream URL, no 'origin' remote, no "
            "Repository URL in its package metadata); set \"template\" in .cruft.json to it",
            file=sys.stderr,
        )
    commit = git("rev-parse", "HEAD")
    answers = {k: v for k, v in CONTEXT.items() if not k.startswith("_")}
    state = {
        "template": repository,
        "commit": commit,
        "checkout": ref,
        "context": {"cookiecutter": {**answers, "_template": repository, "_commit": commit}},
        "directory": TEMPLATE_DIRECTORY,
        "skip": [".venv", ".git"],
    }
    Path(".cruft.json").write_text(json.dumps(state, indent=2) + "\n")
