#!/usr/bin/env bash
# Create .venv at the repository root with hintpipe installed in editable mode.
# The project supports torch 2.13 and 2.14 (pyproject.toml); this set-up, the one the
# test suite runs on, pins 2.13.0 and installs it first, on its own, so that the range cannot
# pull a different build. It comes from pip's configured index (the CPU build the tests run on);
# on a GPU machine give the index of a CUDA build of the same version instead (README, "On GPUs"):
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash scripts/setup.sh
# The hf extra (transformers, for Hugging Face models) needs no torch of its own; the data extra (datasets,
# for --data of a Hugging Face dataset) neither.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
index=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  index=(--index-url "$TORCH_INDEX_URL")
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check ${index[@]+"${index[@]}"} "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,hf,data]"
