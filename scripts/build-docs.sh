#!/usr/bin/env bash
# Build the docs site into site/ with --strict (every warning fails). The API pages are read from
# a copy of the package in its installed shape (scripts/installed-tree.sh), under build/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/installed-tree.sh build/api-src
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict "$@"
