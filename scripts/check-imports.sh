#!/usr/bin/env bash
# Check the import contracts in .importlinter, on a copy of the package in its installed shape
# (scripts/installed-tree.sh: import-linter finds a package's modules by walking its directory).
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
./scripts/installed-tree.sh "$tree"
cp .importlinter "$tree/"
cd "$tree"
PYTHONPATH="$tree" "$OLDPWD/.venv/bin/lint-imports" --no-cache
