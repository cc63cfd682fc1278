#!/usr/bin/env bash
# Copy the package into DIR in its installed shape: the layers live at the repository's top level
# (domain/, commands/, projections/, query_api/) and are installed as foldstream.* subpackages.
# Tools that find modules by walking a package's directory (import-linter, the docs' API pages)
# read this copy.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1
rm -rf "$target/foldstream"
mkdir -p "$target"
cp -r foldstream "$target/foldstream"
for layer in domain commands projections query_api; do
    rm -rf "${target:?}/foldstream/$layer"
    cp -r "$layer" "$target/foldstream/$layer"
done
find "$target" -name __pycache__ -prune -exec rm -rf {} +
