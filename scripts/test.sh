#!/usr/bin/env bash
# Set up .venv, then run the linters, the type checker, the import graph's rules and the test suite.
# pytest runs the test files on four workers (pytest-xdist; each file on one worker, so a file's spawned rank
# groups are shared by its tests as in a serial run) and prints the 25 slowest tests and the seconds each test
# file took (the suite's time budget; summed over the workers). Four on two cores: the longest files wait more
# than they compute (test_kept_order sleeps its emulated tasks for 3 minutes, the fault tests wait for
# timeouts), and the other workers run other files meanwhile. The longest files start first, in the order
# tests/conftest.py gives (LONGEST_FILES); six workers and eight were slower (eight also ran fault tests past
# their bounds). Pass -n 0 to run serially.
# mypy runs beside pytest (the suite leaves about 40% of the two cores idle while its ranks start, sleep and
# wait for timeouts; mypy's minute fits in it), and its report is printed after pytest's; the command fails if
# either does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/python scripts/import_graph.py
mypy_report=$(mktemp)
trap 'rm -f "$mypy_report"' EXIT
.venv/bin/mypy >"$mypy_report" 2>&1 &
mypy_pid=$!
pytest_status=0
.venv/bin/python -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=25 "$@" || pytest_status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
echo "mypy:"
cat "$mypy_report"
if [[ $pytest_status -ne 0 || $mypy_status -ne 0 ]]; then
  echo "failed: pytest exit $pytest_status, mypy exit $mypy_status" >&2
  exit 1
fi
