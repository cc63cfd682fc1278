"""Reject answers that would make a broken service, before any file is written.

Exits 1 with one ``error:`` line per problem (cookiecutter then removes the project directory).
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

NAME = {{ cookiecutter.service_name | tojson }}
SLUG = {{ cookiecutter.project_slug | tojson }}
PACKAGE = {{ cookiecutter.package_name | tojson }}
URL = {{ cookiecutter.foldstream_url | tojson }}

# Top-level names a service package must not shadow: the framework, its dependencies, test dirs.
TAKEN = {
    "foldstream", "pyspark", "pandas", "pyarrow", "eventsourcing", "confluent_kafka", "starlette",
    "uvicorn", "rocksdict", "tenacity", "pytest", "pytest_bdd", "cookiecutter", "typer", "rich",
    "aiohttp", "domain", "commands", "projections", "query_api", "features", "tests", "conftest",
}


def problems() -> list[str]:
    found = []
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9 _-]{0,59}", NAME):
        found.append(
            f"service name {NAME!r}: use letters, digits, spaces, '-' or '_', starting with a "
            "letter, at most 60 characters (e.g. 'Warehouse Ledger')"
        )
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", SLUG):
        found.append(
            f"project slug {SLUG!r} (the directory, distribution name and Kafka topic prefix): "
            "use lowercase letters, digits and '-', starting with a letter (e.g. 'warehouse-ledger')"
        )
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", PACKAGE) or keyword.iskeyword(PACKAGE):
        found.append(
            f"Python package {PACKAGE!r}: use lowercase letters, digits and '_', starting with a "
            "letter, and not a Python keyword (e.g. 'warehouse_ledger')"
        )
    elif PACKAGE in sys.stdlib_module_names or PACKAGE in TAKEN:
        found.append(
            f"Python package {PACKAGE!r} would shadow the module of the same name: choose "
            f"another service name or package (e.g. '{PACKAGE}_service')"
        )
    found += url_problems(URL)
    return found


def url_problems(text: str) -> list[str]:
    """What is wrong with the foldstream URL (empty: foldstream comes from the package index)."""
    if not text:
        return []
    url = urlparse(text)
    if not re.fullmatch(r"file|https?|git\+(https?|ssh|file)", url.scheme):
        return [
            f"foldstream URL {text!r}: give a file:// URL of a foldstream checkout or wheel, a "
            "git+https:// URL pip can install from, or nothing for the package index"
        ]
    if url.scheme != "file":
        return []
    path = Path(unquote(url.path))
    if path.suffix == ".whl" and path.is_file():
        return []
    if not (path / "pyproject.toml").is_file():
        return [f"foldstream URL {text!r}: no foldstream checkout (pyproject.toml) or wheel there"]
    return []


errors = problems()
for error in errors:
    print(f"error: {error}", file=sys.stderr)
sys.exit(1 if errors else 0)
