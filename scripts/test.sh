#!/usr/bin/env bash
# Set up .venv, then run the linters, the import graph's rules, the type checker and the test suite.
# pytest runs the test files on four workers (pytest-xdist; each file on one worker, so a file's spawned rank
# groups are shared by its tests as in a serial run) and prints the 25 slowest tests and the seconds each test
# file took (the suite's time budget; summed over the workers). Four on two cores: the longest files wait more
# than they compute (test_kept_order sleeps its emulated tasks for 3 minutes, the fault tests wait for
# timeouts), and the other workers run other files meanwhile; six were slower (883 s against 743: the suite is
# then bound by the two cores). The longest files start first, in the order tests/conftest.py gives
# (LONGEST_FILES). Pass -n 0 to run serially.
# mypy (50 s from a fresh clone) runs beside the tests, in the time their waits leave on the cores; its report
# comes after theirs, and either failing fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/python scripts/import_graph.py
typing_report=$(mktemp)
.venv/bin/mypy > "$typing_report" 2>&1 &
typing=$!
trap 'kill "$typing" 2>/dev/null || true; rm -f "$typing_report"' EXIT
tests=0
.venv/bin/python -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=25 "$@" || tests=$?
typed=0
wait "$typing" || typed=$?
echo "mypy:"
cat "$typing_report"
if ((tests != 0 || typed != 0)); then
    echo "failed:$( ((tests != 0)) && echo " the tests (pytest exit status $tests)")$( ((typed != 0)) && echo " the type check")" >&2
    exit 1
fi
