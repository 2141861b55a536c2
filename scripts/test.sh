#!/usr/bin/env bash
# The project's test command (README "Quick start" and .ci/run): lint, type-check, import contracts, tests.
#
#   scripts/test.sh [--fast] [--install-deps] [PYTEST ARGS...]
#     --fast          skip the end-to-end tests (marked `slow` in tests/conftest.py): the inner loop
#     --install-deps  first install the system parts the tests need (scripts/install-test-deps.sh; as
#                     root, or through sudo)
#
# The last line names each system part that is missing (so its tests were skipped) and the command that
# installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
install=0
pytest_args=()
for arg in "$@"; do
  case "$arg" in
    --fast) fast=1 ;;
    --install-deps) install=1 ;;
    *) pytest_args+=("$arg") ;;
  esac
done
if [ "$install" -eq 1 ]; then echo "== system parts" && scripts/install-test-deps.sh; fi
if [ "$fast" -eq 1 ]; then pytest_args=(-m "not slow" "${pytest_args[@]}"); fi

echo "== ruff" && ruff check infer_ctl tests scripts
echo "== mypy" && mypy
echo "== import contracts" && lint-imports --no-cache --no-logo  # [tool.importlinter] in pyproject.toml
echo "== pytest"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
set +e
python -m pytest -q -p no:cacheprovider --junitxml="$report" "${pytest_args[@]}"
rc=$?
set -e
# pytest exits 5 when a selection legitimately collects nothing (e.g. -m ssh on a host without sshd).
if [ "$rc" -eq 5 ]; then echo "no tests collected"; rc=0; fi
skipped=$(python -c 'import sys, xml.etree.ElementTree as ET
try: print(sum(int(s.get("skipped", 0)) for s in ET.parse(sys.argv[1]).iter("testsuite")))
except (ET.ParseError, OSError): print("?")' "$report")
TESTS_SKIPPED="$skipped" scripts/install-test-deps.sh --check
exit "$rc"
