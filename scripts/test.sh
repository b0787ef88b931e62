#!/usr/bin/env bash
# Set up .venv, then run the linters, the type checker, the import graph's rules and the test suite.
# pytest prints the 25 slowest tests and the seconds each test file took (the suite's time budget).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/mypy
.venv/bin/python scripts/import_graph.py
.venv/bin/python -m pytest -q --durations=25 "$@"
