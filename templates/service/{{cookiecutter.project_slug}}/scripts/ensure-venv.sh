#!/usr/bin/env bash
# Create or reuse .venv with this project and its dev tools; safe to run any number of times.
# Every service generated from foldstream's template has this script (scripts/ensure-venv.sh of
# the foldstream repository is a link to the template's copy).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "error: $PYTHON not found; install Python 3.11+ (e.g. apt-get install python3 python3-venv)" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: Python 3.11+ is required, found $("$PYTHON" --version 2>&1)" >&2
    exit 1
fi
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    echo "error: Spark needs Java 17 or 21 and 'java' was not found;" \
         "install it (apt-get install openjdk-17-jre-headless) or set JAVA_HOME" >&2
    exit 1
fi
java_major=$("${JAVA_HOME:+$JAVA_HOME/bin/}java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
    echo "error: Spark needs Java 17 or 21, found '${java_major:-unknown}';" \
         "install openjdk-17-jre-headless or set JAVA_HOME" >&2
    exit 1
fi

stamp=.venv/.foldstream-installed
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# Reinstall only when the dependency list changed since the last install.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[dev]'
    touch "$stamp"
fi
