#!/usr/bin/env bash
# A shard killed with SIGKILL mid-run and restarted from its checkpoint:
# the workers notice (UNAVAILABLE), retry with backoff or re-register
# (rejoin), re-sync from snapshots and finish without anyone stepping in.
# The same job runs twice, undisturbed ("calm") and with shard 1 killed
# after KILL_AT steps ("failed"); the checks:
#   - the restarted shard completed the rest of the job: its step ends at
#     STEPS, it ran rounds after the restart (more than 0), and it applied
#     exactly workers x rounds pushes in them (none twice);
#   - the workers noticed the failure: some counted an RPC retry or a
#     rejoin (retries and rejoins from its --summary_json), and the
#     registrations the restarted shard answered equal the rejoins the
#     workers counted. Not necessarily every worker: a call made while the
#     shard is down waits for it (gRPC's wait_for_ready) instead of
#     failing, and the restored shard knows the worker's registration, so a
#     worker with no call in flight at the kill sees nothing (1 run in
#     about 30);
#   - one model: the four workers' final weights (--save_weights) are
#     bit-identical, and equal the shards' own replica x_hat in the
#     checkpoints they write on SIGTERM at step STEPS;
#   - the final test accuracy is within ACC_TOLERANCE (default 2 points)
#     of the calm run's. The calm run is deterministic per seed; a failure
#     loses 0 to ~10 rounds on the restarted shard (where the kill lands
#     against the checkpoints) and so moves the result. Measured, failed
#     minus calm in test accuracy points (STEPS=1500, KILL_AT=600, 4
#     workers, 2 shards, on 2 busy cores, November 2026; 24 runs, 10 seeds):
#       seed 1: +0.14 -0.23 +0.32 0.00 +0.68 +0.51 +0.94 -0.29 +0.63 +0.63
#               -0.23 -0.08 -0.14
#       seed 2: -0.12   seed 3: -0.27   seed 4: -1.15 -0.75 -0.36
#       seed 5: -0.53   seed 6: +0.07   seed 7: +0.21   seed 8: +0.12
#       seed 9: 0.00    seed 10: +0.30
#     mean +0.02, standard deviation 0.48, largest 1.15 (an earlier build
#     once measured 1.3). Seed 1's 0.00: the shard restored the round it was
#     killed in and no push was lost; the run equalled the calm one bit for
#     bit. 2 points is over 4 standard deviations either side of the mean
#     and 1.7x the largest difference measured: this test is in the default
#     suite, so it must not flake, and the checks above, not the accuracy,
#     are what catch a recovery that goes wrong (a lost model, a stuck
#     round, workers on different models).
#
#   tests/e2e/shard_failure_test.sh SERVER_BIN WORKER_BIN
#   (env: SEED, STEPS, KILL_AT, ACC_TOLERANCE, TRAIN_SUBSET, CHECKPOINT_EVERY,
#   KEEP=1 keeps the run folder)
set -euo pipefail
SERVER="$1"
WORKER="$2"
STEPS="${STEPS:-1500}"
KILL_AT="${KILL_AT:-600}"
SEED="${SEED:-1}"
DIR="$(mktemp -d /tmp/pserver-fail.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ "${KEEP:-0}" == 1 ]] || rm -rf "$DIR"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$DIR"/*/*.log; do echo "== $f"; tail -5 "$f"; done >&2
  exit 1
}
command -v curl >/dev/null || { echo "FAIL: curl is not installed; tests/run.sh installs it"; exit 1; }

start_shard() {  # run shard
  local run=$1 s=$2 port_arg=$3
  "$SERVER" --shard_index="$s" --num_shards=2 --num_workers=4 \
    --listen="127.0.0.1:$port_arg" --metrics_listen=127.0.0.1:0 \
    --port_file="$DIR/$run/port$s" --freeze_step=100 \
    --checkpoint_dir="$DIR/$run/ckpt$s" --checkpoint_every="${CHECKPOINT_EVERY:-5}" \
    >>"$DIR/$run/shard$s.log" 2>&1 &
  PIDS+=($!)
  eval "SHARD_PID_${s}=$!"
}
wait_port() {
  for _ in $(seq 300); do [[ -s "$1" ]] && { cat "$1"; return; }; sleep 0.05; done
  fail "no port file $1"
}
run_job() {  # run_job NAME KILL(0/1)
  local run=$1 kill_shard=$2
  mkdir -p "$DIR/$run"
  start_shard "$run" 0 0
  start_shard "$run" 1 0
  local p0 p1
  p0=$(wait_port "$DIR/$run/port0")
  p1=$(wait_port "$DIR/$run/port1")
  local wpids=()
  for w in 0 1 2 3; do
    "$WORKER" --servers="127.0.0.1:$p0,127.0.0.1:$p1" --worker_id=$w \
      --num_workers=4 --steps="$STEPS" --seed="$SEED" \
      --train_subset="${TRAIN_SUBSET:-0}" --test_subset=0 \
      --push_codec=onebit --warmup_codec=bf16 --progress=lines --log_interval=1 \
      --retry_budget=60 \
      --save_weights="$DIR/$run/w$w.bin" --summary_json="$DIR/$run/w$w.json" \
      >"$DIR/$run/worker$w.log" 2>&1 &
    wpids+=($!)
    PIDS+=($!)
  done
  if [[ $kill_shard == 1 ]]; then
    # Wait until the job is past KILL_AT steps, then kill shard 1 hard.
    for _ in $(seq 1200); do
      step=$(grep -o 'step [0-9]*' "$DIR/$run/worker0.log" | tail -1 | cut -d' ' -f2 || true)
      [[ -n "$step" && "$step" -ge "$KILL_AT" ]] && break
      sleep 0.05
    done
    kill -9 "$SHARD_PID_1"
    wait "$SHARD_PID_1" 2>/dev/null || true
    echo "killed shard 1 at step ${step:-?}" >"$DIR/$run/kill.txt"
    sleep 1
    start_shard "$run" 1 "$p1"   # same port: the workers' channels reconnect
  fi
  for w in 0 1 2 3; do
    wait "${wpids[w]}" || fail "$run: worker $w exited with status $?"
  done
}

run_job calm 0
run_job failed 1

field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1"; }
calm=$(field "$DIR/calm/w0.json" test_accuracy)
failed=$(field "$DIR/failed/w0.json" test_accuracy)
tol="${ACC_TOLERANCE:-0.02}"
echo "seed $SEED: $(cat "$DIR/failed/kill.txt"); accuracy undisturbed $calm, with the failure $failed (tolerance $tol)"
awk -v a="$calm" -v b="$failed" -v t="$tol" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }' ||
  fail "accuracy differs by more than $tol ($calm vs $failed)"
grep -q "restored step" "$DIR/failed/shard1.log" || fail "shard 1 did not restore a checkpoint"

# The restarted shard: it reached STEPS, ran rounds after the restart, and
# its applied pushes (one per contributing worker and completed round)
# equal 4 x those rounds. (Decoded elements would overcount: a push summed
# into a round that a later fast-forward drops is decoded but not applied.)
mport=$(grep "listening" "$DIR/failed/shard1.log" | tail -1 | sed -n 's/.*(metrics port \([0-9]*\)).*/\1/p')
metrics=$(curl -sf "http://127.0.0.1:$mport/metrics") || fail "cannot scrape shard 1"
value() { awk -v n="$1" '$1 ~ "^"n"([{]|$)" {print $2; exit}' <<<"$metrics"; }
applied=$(value pserver_server_applied_pushes_total)
final_step=$(value pserver_server_step)
registers=$(awk '$1 ~ /^pserver_server_requests_total[{]/ && /method="Register"/ && /code="OK"/ {t += $2}
                 END {printf "%.0f", t}' <<<"$metrics")
restored=$(sed -n 's/.*restored step \([0-9]*\).*/\1/p' "$DIR/failed/shard1.log" | tail -1)
skipped_to=$(sed -n 's/.* skips from step [0-9]* to \([0-9]*\).*/\1/p' "$DIR/failed/shard1.log" | tail -1)
first=${skipped_to:-$restored}
applied=$(awk -v a="$applied" 'BEGIN{printf "%.0f", a}')
rounds=$((final_step - first))
[[ "$final_step" == "$STEPS" ]] ||
  fail "the restarted shard stopped at step $final_step, not $STEPS"
(( rounds > 0 )) || fail "the restarted shard completed no rounds (resumed at $first, ended at $final_step)"
[[ "$applied" == "$((4 * rounds))" ]] ||
  fail "restarted shard applied $applied pushes for rounds $first..$final_step; expected $((4 * rounds))"

# The workers: some retried or rejoined; the shard saw every rejoin.
rejoins_total=0
noticed=0
counts=""
for w in 0 1 2 3; do
  retries=$(field "$DIR/failed/w$w.json" retries)
  rejoins=$(field "$DIR/failed/w$w.json" rejoins)
  counts+=" w$w ${retries}/${rejoins}"
  (( retries + rejoins > 0 )) && noticed=$((noticed + 1))
  rejoins_total=$((rejoins_total + rejoins))
done
(( noticed > 0 )) || fail "no worker retried or rejoined across shard 1's restart"
[[ "$registers" == "$rejoins_total" ]] ||
  fail "the restarted shard answered $registers registrations; the workers counted $rejoins_total rejoins"

# One model: the workers' final weights, identical, and the shards' replica.
for w in 1 2 3; do
  cmp -s "$DIR/failed/w0.bin" "$DIR/failed/w$w.bin" ||
    fail "worker $w ended with other weights than worker 0"
done
kill -TERM "$SHARD_PID_0" "$SHARD_PID_1"
for pid in "$SHARD_PID_0" "$SHARD_PID_1"; do
  wait "$pid" || fail "a shard did not exit 0 on SIGTERM"
done
/usr/bin/python3 - "$DIR/failed" "$STEPS" <<'PY' || fail "the workers' final weights are not the shards' model"
# The newest checkpoint of each shard (server/checkpoint.h, version 6):
# its step must be STEPS and its x_hat, shard 0's then shard 1's, the
# workers' final weights byte for byte.
import glob, struct, sys
run, steps = sys.argv[1], int(sys.argv[2])
x_hat = b""
for s in (0, 1):
    path = sorted(glob.glob(f"{run}/ckpt{s}/ckpt-*.pserver"))[-1]
    b = open(path, "rb").read()
    version, = struct.unpack_from("<I", b, 8)
    step, = struct.unpack_from("<Q", b, 32)
    if b[:8] != b"PSCKPT\0\1" or version != 6 or step != steps:
        sys.exit(f"{path}: version {version}, step {step}; expected 6, {steps}")
    off = 97                                 # the fixed header
    for _ in range(2):                       # blobs: layout, delta
        n, = struct.unpack_from("<Q", b, off)
        off += 8 + n
    for _ in range(4):                       # floats: x, m, v, x_hat
        n, = struct.unpack_from("<Q", b, off)
        arr = b[off + 8:off + 8 + 4 * n]
        off += 8 + 4 * n
    x_hat += arr
w = open(f"{run}/w0.bin", "rb").read()
if w != x_hat:
    sys.exit(f"worker 0 holds {len(w) // 4} floats, the shards' x_hat {len(x_hat) // 4}; "
             "they differ" if len(w) == len(x_hat) else "sizes differ")
PY
echo "PASS: restored step $restored, resumed at $first, applied $applied pushes in $rounds rounds (no duplicates);" \
  "retries/rejoins per worker:$counts ($registers registrations); one model on the 4 workers and the shards"
