#!/usr/bin/env bash
# The prepared GPU check (about 10 minutes at most on one GPU; see README.md):
#   bash benchmarks/gpu/run.sh OUT_DIR [--device cuda|cpu] [--quick]
# Writes OUT_DIR/results.md and OUT_DIR/results.json.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash benchmarks/gpu/run.sh OUT_DIR [--device cuda|cpu] [--quick]" >&2
    exit 2
fi
out="$1"
shift
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac  # as given, before the cd below
cd "$(dirname "$0")/../.."
python=python
[[ -x .venv/bin/python ]] && python=.venv/bin/python
status=0
"$python" benchmarks/gpu/gpu_check.py --out "$out" "$@" || status=$?
[[ -f "$out/results.md" ]] && echo "results: $out/results.md and $out/results.json"
exit "$status"
