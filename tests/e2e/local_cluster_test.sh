#!/usr/bin/env bash
# End to end on loopback: 2 real pserver_server and 4 real pserver_worker
# processes train the MLP on Fashion-MNIST with 1-bit Adam (1-bit pushes and
# pulls) for a few hundred steps. Checks that every worker finishes with
# test accuracy well above chance, that all workers hold the same model, and
# that the bytes the workers report agree with what the shards' Prometheus
# metrics counted.
#
#   tests/e2e/local_cluster_test.sh SERVER_BIN WORKER_BIN
set -euo pipefail
SERVER="$1"
WORKER="$2"
STEPS="${STEPS:-300}"
DIR="$(mktemp -d /tmp/pserver-e2e.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$DIR"/*.log; do echo "== $f"; tail -5 "$f"; done >&2; exit 1; }

command -v curl >/dev/null || { echo "FAIL: curl is not installed; tests/run.sh installs it"; exit 1; }

servers=()
for s in 0 1; do
  "$SERVER" --shard_index=$s --num_shards=2 --num_workers=4 \
    --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --port_file="$DIR/port$s" \
    --freeze_step=100 >"$DIR/shard$s.log" 2>&1 &
  PIDS+=($!)
done
for s in 0 1; do
  for _ in $(seq 200); do [[ -s "$DIR/port$s" ]] && break; sleep 0.05; done
  [[ -s "$DIR/port$s" ]] || fail "shard $s did not start"
  servers+=("127.0.0.1:$(cat "$DIR/port$s")")
done
metrics_port() { sed -n 's/.*(metrics port \([0-9]*\)).*/\1/p' "$DIR/shard$1.log"; }

worker_pids=()
for w in 0 1 2 3; do
  "$WORKER" --servers="${servers[0]},${servers[1]}" --worker_id=$w --num_workers=4 \
    --steps="$STEPS" --batch_size=32 --train_subset=20000 --test_subset=2000 \
    --push_codec=onebit --warmup_codec=bf16 --progress=lines --log_interval=1000 \
    --save_weights="$DIR/w$w.bin" --summary_json="$DIR/w$w.json" >"$DIR/worker$w.log" 2>&1 &
  worker_pids+=($!)
  PIDS+=($!)
done
for w in 0 1 2 3; do
  wait "${worker_pids[$w]}" || fail "worker $w exited non-zero"
done

field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1"; }
sum_field() { local t=0; for w in 0 1 2 3; do t=$((t + $(field "$DIR/w$w.json" "$1"))); done; echo $t; }
for w in 1 2 3; do
  cmp -s "$DIR/w0.bin" "$DIR/w$w.bin" || fail "worker $w holds different weights than worker 0"
done
acc=$(field "$DIR/w0.json" test_accuracy)
awk -v a="$acc" 'BEGIN{exit !(a > 0.6)}' || fail "test accuracy $acc is not well above chance (0.1)"

server_counter() {  # sum over shards of a counter family
  local total=0 s v
  for s in 0 1; do
    v=$(curl -sf "http://127.0.0.1:$(metrics_port $s)/metrics" |
        awk -v name="$1" '$1 ~ "^"name"[{]" {t += $2} END {printf "%.0f", t}')
    total=$((total + v))
  done
  echo $total
}
push_workers=$(sum_field push_bytes)
pull_workers=$(sum_field pull_bytes)
push_server=$(server_counter pserver_server_received_payload_bytes_total)
pull_server=$(server_counter pserver_server_sent_payload_bytes_total)
[[ "$push_workers" == "$push_server" ]] || fail "workers pushed $push_workers bytes, shards received $push_server"
[[ "$pull_workers" == "$pull_server" ]] || fail "workers pulled $pull_workers bytes, shards sent $pull_server"
for s in 0 1; do
  kill -TERM "${PIDS[$s]}"
done
for s in 0 1; do
  wait "${PIDS[$s]}" || fail "shard $s did not exit 0 on SIGTERM"
done
echo "PASS: accuracy $acc after $STEPS steps; push $push_workers bytes, pull $pull_workers bytes (workers == shards)"
