#!/usr/bin/env bash
# The prepared GPU check (sized for at most 5 minutes on one GPU; see README.md):
#   bash benchmarks/gpu/run.sh OUT_DIR [--device cuda|cpu] [--only 1,3]
# Every check runs, even after one failed; each writes OUT_DIR/NN-name.md and .json as it ends, and
# OUT_DIR/results.md and results.json hold every check so far. Exit status 1 if any check failed.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash benchmarks/gpu/run.sh OUT_DIR [--device cuda|cpu] [--only 1,3]" >&2
    exit 2
fi
out="$1"
shift
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac  # as given, before the cd below
cd "$(dirname "$0")/../.."
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
[[ -n "${PYTHON:-}" ]] && python="$PYTHON"
status=0
"$python" benchmarks/gpu/gpu_check.py --out "$out" "$@" || status=$?
[[ -f "$out/results.md" ]] && echo "results: $out/results.md and $out/results.json"
exit "$status"
