#!/usr/bin/env bash
# Create .venv at the repository root with hintpipe installed in editable mode.
# The project supports torch 2.13 and 2.14 (pyproject.toml); this set-up, the one the
# test suite runs on, pins the CPU build of 2.13.0 and installs it first, on its own,
# so that the range cannot pull a different build. The hf extra (transformers, for
# Hugging Face models) needs no torch of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,hf]"
