#!/usr/bin/env bash
# Every GPU check of this repository in one run, for a CUDA machine lent for a few minutes:
#
#   scripts/gpu_checks.sh [DIR]     # JSONs into DIR (from the repository root; default results/gpu, ignored by git)
#
# The Triton pool kernels at 32k tokens (exactness, then bandwidth), layer streaming of a
# stand-in prefill forward, and the decode side's anchor write and residual upgrade on a GPU
# pool. Each check is bounded by CHECK_TIMEOUT_S seconds (default 200: all three within 10 minutes); a check that fails or
# runs out of time does not stop the others. Needs torch, Triton, numpy and pyzmq (no SGLang).
# Exit status: 0 every check passed, 1 one failed or timed out, 2 no CUDA GPU.
set -u
cd "$(dirname "$0")/.."
DIR=${1:-results/gpu}
LIMIT=${CHECK_TIMEOUT_S:-200}
export PYTHONPATH=python:kernels:.:test/support
PY=${PYTHON:-python}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA GPU visible; nothing checked" >&2
    exit 2
fi
mkdir -p "$DIR"

status=0
check() {
    local name=$1
    shift
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "$LIMIT" "$PY" "$@" --json "$DIR/$name.json" >"$DIR/$name.log" 2>&1
    local rc=$?
    tail -n 15 "$DIR/$name.log"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

check kernels_32k scripts/gpu_check_kernels.py --tokens 32768
check layer_streaming scripts/gpu_check_layer_streaming.py
check decode_upgrade scripts/gpu_check_decode_upgrade.py
exit $status
