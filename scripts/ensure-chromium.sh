#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for the browser tests (tests/test_dashboard.py), if
# it is missing; prints the browser's path. Fails loudly when it cannot be installed: the tests
# that need it must not be skipped on a machine without it.
set -euo pipefail
for candidate in "${CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
        echo "$candidate"
        exit 0
    fi
done
if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: Chromium is missing and apt-get is not available; install Chromium and set" \
         "CHROMIUM to its path" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "error: Chromium is missing; install it as root: apt-get install -y chromium" >&2
        exit 1
    fi
    sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
echo /usr/bin/chromium
