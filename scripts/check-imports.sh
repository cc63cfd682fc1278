#!/usr/bin/env bash
# Check the import contracts in .importlinter. The layers live at the repository's top level
# (domain/, commands/, projections/, query_api/) and are installed as foldstream.* subpackages;
# import-linter finds a package's modules by walking its directory, so it is given a copy of
# the tree in its installed shape.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
cp -r foldstream "$tree/foldstream"
for layer in domain commands projections query_api; do
    rm -rf "$tree/foldstream/$layer"
    cp -r "$layer" "$tree/foldstream/$layer"
done
cp .importlinter "$tree/"
cd "$tree"
PYTHONPATH="$tree" "$OLDPWD/.venv/bin/lint-imports" --no-cache
