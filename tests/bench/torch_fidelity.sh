#!/usr/bin/env bash
# PyTorch fidelity benchmark (not a unit test): pserver's DistributedOptimizer
# on the two example models (python/examples/fashion_cnn.py, a CNN on
# Fashion-MNIST, and char_transformer.py, a character-level transformer on
# the Python standard library's source), 4 workers, against torch.optim.Adam
# in one process on the same mean gradients and against PyTorch DDP over gloo
# (fp32, fp16_compress_hook, powerSGD_hook rank 4). What runs and how bytes
# are counted: tests/bench/torch_fidelity.py's docstring.
#
#   tests/bench/torch_fidelity.sh                 # everything, seeds 1 2 3 (long)
#   tests/bench/torch_fidelity.sh --results       # into tests/bench/results/
#   SEEDS=1 WORKLOADS=cnn RUNS="torch_adam ps_adam_fp32" tests/bench/torch_fidelity.sh
#
# Variables: SEEDS ("1 2 3"), WORKLOADS ("cnn transformer"), RUNS (all),
# EPOCHS (cnn, 2), TRANSFORMER_STEPS (200), FREEZE_STEP (cnn 1-bit Adam, 100),
# TRANSFORMER_FREEZE_STEP (50), K_FRACTION (0.01), SHARD_FLAGS (extra
# pserver_server flags for ps_onebit, ps_onebit_wm and ps_topk), BUILD
# (./build), OUT (a results folder; --results: tests/bench/results, each run's logs in a new
# /tmp folder), WORK (each run's logs). Needs a build with the
# Python package (tests/run.sh does it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
OUT="${OUT:-$ROOT/results/torch_fidelity}"
die() { echo "torch_fidelity.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --results) OUT="$ROOT/tests/bench/results"
               WORK="${WORK:-$(mktemp -d /tmp/pserver-torch-fidelity.XXXXXX)}"; shift ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'; expected --results or --help" ;;
  esac
done
[[ -x "$BUILD/server/pserver_server" ]] ||
  die "no $BUILD/server/pserver_server: build first (tests/run.sh)"
ls "$BUILD"/python/pserver/_native*.so >/dev/null 2>&1 ||
  die "no Python extension in $BUILD/python/pserver: build first (tests/run.sh)"

# shellcheck disable=SC2086
exec /usr/bin/python3 "$ROOT/tests/bench/torch_fidelity.py" \
  --seeds ${SEEDS:-1 2 3} --workloads ${WORKLOADS:-cnn transformer} \
  ${RUNS:+--runs $RUNS} --epochs "${EPOCHS:-2}" \
  --transformer-steps "${TRANSFORMER_STEPS:-200}" \
  --freeze-step "${FREEZE_STEP:-100}" \
  --transformer-freeze-step "${TRANSFORMER_FREEZE_STEP:-50}" \
  --k-fraction "${K_FRACTION:-0.01}" --shard-flags="${SHARD_FLAGS:-}" \
  --server-bin "$BUILD/server/pserver_server" \
  --package-root "$BUILD/python" --out "$OUT" ${WORK:+--work "$WORK"}
