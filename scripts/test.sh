#!/usr/bin/env bash
# The test command: installs what it needs (scripts/setup.sh), then runs the suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k e2e
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest -q --durations=15 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests (exit 5); nothing failed"; exit 0
fi
exit "$rc"
