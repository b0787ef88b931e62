#!/usr/bin/env bash
# Set up .venv, then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/hintpipe demo "$@"
