#!/usr/bin/env bash
# Per-step overhead before and after, side by side in one run:
#   bash benchmarks/step-overhead/run.sh [BASE_REV]   (default: the commit before the reorganisation)
# The baseline runs from a temporary worktree of BASE_REV with the API it had.
set -euo pipefail
cd "$(dirname "$0")/../.."
base="${1:-d16c8de}"
tree="$(mktemp -d)"
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add --quiet --detach "$tree" "$base"
echo "baseline $base"
PYTHONPATH="$tree/src" .venv/bin/python benchmarks/step-overhead/step_overhead.py --baseline "${@:2}"
echo "current $(git rev-parse --short HEAD)"
.venv/bin/python benchmarks/step-overhead/step_overhead.py --report-every 1 0 "${@:2}"
