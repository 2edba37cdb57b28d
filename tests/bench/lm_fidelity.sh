#!/usr/bin/env bash
# Language-model fidelity benchmark (not a unit test, issue 28): the GPT of
# python/examples/gpt.py (GPTConfig.bench(), 1.03M parameters) trained by
# python/examples/train_gpt.py's recipe (2000 steps, global batch 16, AdamW,
# warmup + cosine, clipping), 2 workers: torch.optim.AdamW in one process
# (the reference), DDP over gloo (fp32, PowerSGD rank 4), and pserver with 2
# shards (fp32, 1-bit Adam, TopK 1%, DiLoCo with 16 or 64 local steps and
# 8-bit or 1-bit pushes). Prints the validation loss against traffic and
# met/MISSED against the targets; rows, recipes and byte counting:
# /usr/bin/python3 tests/bench/lm_fidelity.py --help.
#
#   tests/bench/lm_fidelity.sh                      # every row, seeds 1 2 3 (~90 min)
#   tests/bench/lm_fidelity.sh --results            # the report into tests/bench/results/
#   SEEDS=1 STEPS=30 RUNS="adamw ddp_fp32" tests/bench/lm_fidelity.sh --size small
#   tests/bench/lm_fidelity.sh --report-only        # the report again from WORK
#   tests/bench/lm_fidelity.sh --extra-row NAME "SHARD FLAGS" "SCRIPT FLAGS"
#   tests/bench/lm_fidelity.sh --restore tests/bench/results/lm_fidelity.json  # then add rows
#   STEPS=8000 RUNS="adamw ps_fp32 diloco_h72_q2_b085 diloco_h80_q2_b085" \
#     WORK=/tmp/lm_long OUT=tests/bench/results/lm_long \
#     tests/bench/lm_fidelity.sh --max-bytes 5000000  # the long table
#
# Variables: SEEDS ("1 2 3"), RUNS (the default rows), STEPS (2000), BUILD
# (./build), OUT (the report's folder, results/lm_fidelity; --results:
# tests/bench/results), WORK (each run's folder, WORK/<row>/<seed>/, default
# results/lm_fidelity/runs; complete runs there are reused, so an
# interrupted table continues with the same WORK). Every other argument goes
# to lm_fidelity.py (--size, --lr, --extra-row, ...).
# Threads: one per process, OpenBLAS's Haswell kernel unless
# OPENBLAS_CORETYPE says otherwise (as fidelity.sh). Needs a build with the
# Python package (tests/run.sh does it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
OUT="${OUT:-$ROOT/results/lm_fidelity}"
die() { echo "lm_fidelity.sh: $*" >&2; exit 2; }
pass=()
report_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --results) OUT="$ROOT/tests/bench/results"; shift ;;
    -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --report-only) report_only=1; pass+=("$1"); shift ;;
    *) pass+=("$1"); shift ;;
  esac
done
if [[ $report_only == 0 ]]; then
  [[ -x "$BUILD/server/pserver_server" ]] ||
    die "no $BUILD/server/pserver_server: build first (tests/run.sh)"
  ls "$BUILD"/python/pserver/_native*.so >/dev/null 2>&1 ||
    die "no Python extension in $BUILD/python/pserver: build first (tests/run.sh)"
fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"

# shellcheck disable=SC2086
exec /usr/bin/python3 "$ROOT/tests/bench/lm_fidelity.py" \
  ${SEEDS:+--seeds $SEEDS} ${RUNS:+--runs $RUNS} ${STEPS:+--steps "$STEPS"} \
  --server-bin "$BUILD/server/pserver_server" --package-root "$BUILD/python" \
  --out "$OUT" ${WORK:+--work "$WORK"} "${pass[@]}"
