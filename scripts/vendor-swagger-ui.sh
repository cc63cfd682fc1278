#!/usr/bin/env bash
# Refresh the Swagger UI files that GET /docs serves (foldstream/assets/docs/vendor/swagger-ui):
# they are committed, so an instance never loads anything from a CDN. Needs npm.
#   scripts/vendor-swagger-ui.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-5.35.0}
target=foldstream/assets/docs/vendor/swagger-ui
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "swagger-ui-dist@$version" >/dev/null && tar xzf swagger-ui-dist-*.tgz)
mkdir -p "$target"
for file in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css LICENSE NOTICE; do
    cp "$work/package/$file" "$target/$file"
done
# No source map is shipped: drop the comment that would make a browser's devtools ask for one.
sed -i 's#/\*\# sourceMappingURL=[^*]*\*/##' "$target/swagger-ui.css"
echo "$version" > "$target/VERSION"
echo "Swagger UI $version vendored into $target"
