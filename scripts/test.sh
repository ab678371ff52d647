#!/usr/bin/env bash
# The test command: set up, then the test suite. Extra arguments go to pytest: a group
# (-m unit, -m workflow, -m cluster), a folder (tests/unit) or a file (docs/testing.md).
# MOR_TESTS=all also runs the cases marked slow.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=()
[ "${MOR_TESTS:-}" = "all" ] && args+=(-m "slow or not slow")
exec .venv/bin/python -m pytest "${args[@]}" "$@"
