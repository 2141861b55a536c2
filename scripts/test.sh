#!/usr/bin/env bash
# The project's test command (README "Quick start" and .ci/run): lint, type-check, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ruff" && ruff check infer_ctl tests scripts
echo "== mypy" && mypy
echo "== import contracts" && lint-imports --no-cache --no-logo  # [tool.importlinter] in pyproject.toml
echo "== pytest"
set +e
python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# pytest exits 5 when a selection legitimately collects nothing (e.g. -m ssh on a host without sshd).
if [ "$rc" -eq 5 ]; then echo "no tests collected"; exit 0; fi
exit "$rc"
