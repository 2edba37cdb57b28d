#!/usr/bin/env bash
# fp32 Adam parity with PyTorch (issue 12): a real pserver_server (Adam with
# --bias_correction=true, fp32 pulls) and one pserver_worker (fp32 pushes, batch
# 128) train the MLP on Fashion-MNIST for 20 steps; tests/bench/
# torch_reference.py --recipe pserver trains the same model in PyTorch
# (nn.Linear, F.cross_entropy, autograd, torch.optim.Adam) from pserver's
# seeded initial weights and batch order. Every step's loss must agree to
# 2e-3 (measured: equal to the 4 printed decimals), for both --init choices.
# A difference in the forward pass, the loss, the gradient, the shard's mean
# or Adam shows up within a few steps.
#
#   tests/e2e/torch_parity_test.sh SERVER_BIN WORKER_BIN [PYTHON]
set -euo pipefail
SERVER="$1"
WORKER="$2"
PYTHON="${3:-/usr/bin/python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA="${DATA_DIR:-/usr/share/datasets/fashion-mnist}"
STEPS=20
DIR="$(mktemp -d /tmp/pserver-torch-parity.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$DIR"/*.log; do echo "== $f"; tail -5 "$f"; done >&2; exit 1; }

"$PYTHON" -c 'import torch' 2>/dev/null || { echo "FAIL: no torch for $PYTHON (apt-get install python3-torch); tests/run.sh installs it"; exit 1; }
[[ -e "$DATA/train-images-idx3-ubyte.gz" || -e "$DATA/train-images-idx3-ubyte" ]] ||
  { echo "FAIL: no Fashion-MNIST in $DATA (apt-get install dataset-fashion-mnist); tests/run.sh installs it"; exit 1; }

for init in pytorch he_normal; do
  rm -f "$DIR/port"
  "$SERVER" --shard_index=0 --num_shards=1 --num_workers=1 \
    --listen=127.0.0.1:0 --port_file="$DIR/port" \
    --optimizer=adam --bias_correction=true --lr=0.001 --pull_codec=fp32 \
    >"$DIR/shard-$init.log" 2>&1 &
  server_pid=$!
  PIDS+=($server_pid)
  for _ in $(seq 200); do [[ -s "$DIR/port" ]] && break; sleep 0.05; done
  [[ -s "$DIR/port" ]] || fail "shard did not start"
  "$WORKER" --servers="127.0.0.1:$(cat "$DIR/port")" --worker_id=0 --num_workers=1 \
    --data_dir="$DATA" --steps=$STEPS --batch_size=128 --seed=1 --init=$init \
    --push_codec=fp32 --warmup_codec=fp32 --blas_threads=1 \
    --progress=lines --log_interval=0 >"$DIR/worker-$init.log" 2>&1 ||
    fail "worker (--init=$init) exited non-zero"
  kill -9 "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true

  "$PYTHON" "$ROOT/tests/bench/torch_reference.py" --recipe pserver --init $init \
    --data_dir="$DATA" --steps=$STEPS --print_steps=$STEPS --seeds 1 \
    >"$DIR/torch-$init.log" 2>&1 || fail "torch_reference.py (--init $init) failed"

  # "worker 0 step 3/20 epoch 0 loss 2.2071 ..." -> "3 2.2071" (step from 1);
  # "  step   2 2.2071 2.1968" -> "3 2.2071".
  sed -n 's/^worker 0 step \([0-9]*\)\/[0-9]* epoch [0-9]* loss \([0-9.]*\).*/\1 \2/p' \
    "$DIR/worker-$init.log" >"$DIR/pserver-$init.txt"
  awk '$1 == "step" { print $2 + 1, $3 }' "$DIR/torch-$init.log" >"$DIR/torchloss-$init.txt"
  n=$(wc -l <"$DIR/pserver-$init.txt")
  [[ "$n" -eq $STEPS ]] || fail "--init=$init: the worker logged $n losses, expected $STEPS"
  [[ "$(wc -l <"$DIR/torchloss-$init.txt")" -eq $STEPS ]] || fail "--init=$init: PyTorch printed no $STEPS losses"
  join "$DIR/pserver-$init.txt" "$DIR/torchloss-$init.txt" | awk -v init="$init" '
    { d = $2 - $3; if (d < 0) d = -d; if (d > worst) worst = d
      if (d > 2e-3) { printf "step %d: pserver %s, PyTorch %s\n", $1, $2, $3; bad = 1 } }
    END { printf "--init=%s: %d steps, largest difference %.4f\n", init, NR, worst
          exit (bad || NR != '"$STEPS"') }' || fail "--init=$init: losses differ from PyTorch"
done
echo "PASS: pserver and PyTorch agree on the first $STEPS losses for both --init choices"
