#!/usr/bin/env bash
# Set up .venv, then run the linters, the type checker, the import graph's rules and the test suite.
# pytest runs the test files on four workers (pytest-xdist; each file on one worker, so a file's spawned rank
# groups are shared by its tests as in a serial run) and prints the 25 slowest tests and the seconds each test
# file took (the suite's time budget; summed over the workers). Four on two cores: the longest files wait more
# than they compute (test_kept_order sleeps its emulated tasks for 3 minutes, the fault tests wait for
# timeouts), and the other workers run other files meanwhile. Six were slower (883 s against 743), and mypy run
# beside the tests no faster (875 s, against 743 and 819 for this order): the suite is bound by the two cores.
# The longest files start first, in the order tests/conftest.py gives (LONGEST_FILES). Pass -n 0 to run serially.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The project's own bytecode, compiled once: the suite starts about 220 interpreters that import hintpipe and the
# tests' helpers, and where PYTHONDONTWRITEBYTECODE is set (a common setting for containers) each compiled them
# again from source, 0.3 s of CPU an interpreter (a file of CLI runs took 13% less CPU with it).
.venv/bin/python -m compileall -q src tests benchmarks scripts > /dev/null
.venv/bin/ruff check .
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/mypy
.venv/bin/python scripts/import_graph.py
.venv/bin/python -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
