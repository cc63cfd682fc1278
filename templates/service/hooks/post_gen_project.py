"""Finish a generated service: the framework's venv bootstrap script, and ``.cruft.json``.

``.cruft.json`` records the answers, the template (this foldstream checkout) and its commit, so
``cruft update`` can bring later template changes into the service.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path({{ foldstream_root | tojson }})
CONTEXT = json.loads({{ cookiecutter | jsonify | tojson }})


def template_commit() -> str | None:
    """The checkout's git commit; None when it is not a git repository."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


Path("scripts").mkdir(exist_ok=True)
shutil.copy2(ROOT / "scripts" / "ensure-venv.sh", "scripts/ensure-venv.sh")

# cruft passes "_commit" and keeps .cruft.json itself: writing one into its renders would
# show up in the diff that `cruft update` applies.
if "_commit" not in CONTEXT:
    commit = template_commit()
    answers = {k: v for k, v in CONTEXT.items() if not k.startswith("_")}
    state = {
        "template": str(ROOT),
        "commit": commit,
        "checkout": None,
        "context": {"cookiecutter": {**answers, "_template": str(ROOT), "_commit": commit}},
        "directory": "templates/service",
        "skip": [".venv"],
    }
    Path(".cruft.json").write_text(json.dumps(state, indent=2) + "\n")
