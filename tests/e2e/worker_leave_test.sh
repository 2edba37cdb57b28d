#!/usr/bin/env bash
# pserver_worker --leave_on_sigterm end to end (issue 48, "workers that come
# and go"), real daemons on loopback, about 20 s:
#   1. two workers on one shard whose leases last 120 s; worker 1 gets
#      SIGTERM (a spot notice): it saves its state file, leaves at the next
#      round boundary, says so and exits 0; the shard logs the leave;
#   2. worker 0 trains on at once: 100 rounds past the leave well inside
#      the lease (a worker that vanished would hold the rounds for 120 s);
#   3. worker 1 started again with the same command registers again,
#      restores its residuals from the state file, and both finish;
#   4. without the flag, SIGTERM ends the daemon as before (exit 143), on
#      a one-worker shard of its own.
#
#   tests/e2e/worker_leave_test.sh SERVER_BIN WORKER_BIN
set -euo pipefail
SERVER="$1"; WORKER="$2"
DIR="$(mktemp -d /tmp/pserver-leave.XXXXXX)"
PIDS=()
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$DIR"
  exit "$code"
}
trap cleanup EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }
# last_step LOG: the step of the newest progress line in LOG (0 before one).
last_step() {
  grep -o 'step [0-9]*/' "$1" 2>/dev/null | tail -1 | tr -dc '0-9' || true
}
# wait_for WHAT SECONDS COMMAND...: polls COMMAND every 0.1 s.
wait_for() {
  local what=$1 seconds=$2 i
  shift 2
  for ((i = 0; i < seconds * 10; ++i)); do "$@" && return 0; sleep 0.1; done
  fail "$what: not within ${seconds} s"
}

"$SERVER" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --port_file="$DIR/port" --num_workers=2 \
  --lease_timeout_seconds=120 --optimizer=adam --pull_codec=fp32 \
  >"$DIR/shard.log" 2>&1 &
PIDS+=($!)
wait_for "the shard's port file" 10 test -s "$DIR/port"
SERVERS="127.0.0.1:$(cat "$DIR/port")"
# worker W LOG [FLAGS...]: starts worker W of the 2, its pid in $LAST.
worker() {
  local w=$1 log=$2
  shift 2
  "$WORKER" --servers="$SERVERS" --worker_id="$w" --num_workers=2 \
    --model=synthetic --synthetic_params=4096 --steps=1500 --push_codec=fp32 \
    --compute_delay_ms=5 --progress=lines --log_interval=0.1 "$@" \
    >"$DIR/$log" 2>&1 &
  LAST=$!
  PIDS+=($LAST)
}
LEAVER=(--leave_on_sigterm --state_file="$DIR/w1.state" --state_every=10)
worker 0 w0.log; W0=$LAST
worker 1 w1.log "${LEAVER[@]}"; W1=$LAST

# --- 1. SIGTERM to worker 1 ------------------------------------------------
wait_for "worker 1's first state file (step 10)" 60 test -s "$DIR/w1.state"
kill -TERM "$W1"
code=0; wait "$W1" || code=$?
[[ $code == 0 ]] || fail "worker 1 exited $code on SIGTERM with --leave_on_sigterm; expected 0: $(tail -2 "$DIR/w1.log")"
line=$(grep -m1 "worker 1 left the job at step" "$DIR/w1.log") ||
  fail "worker 1 did not say it left: $(tail -2 "$DIR/w1.log")"
left=$(sed 's/.*at step \([0-9]*\).*/\1/' <<<"$line")
grep -q "worker 1 left at step $left (it was" "$DIR/shard.log" ||
  fail "the shard did not log worker 1's leave at step $left: $(tail -3 "$DIR/shard.log")"
echo "ok: SIGTERM -> $line"

# --- 2. The rounds go on without it, inside its lease ----------------------
past() { local s; s=$(last_step "$DIR/w0.log"); [[ ${s:-0} -ge $((left + 100)) ]]; }
wait_for "worker 0 at step $((left + 100)) (the lease is 120 s)" 60 past
echo "ok: worker 0 went from step $left to $(last_step "$DIR/w0.log") without it"

# --- 3. It comes back with its state file ----------------------------------
worker 1 w1b.log "${LEAVER[@]}"; W1=$LAST
for pid in "$W0" "$W1"; do
  code=0; wait "$pid" || code=$?
  [[ $code == 0 ]] || fail "a worker exited $code after worker 1 came back: $(tail -2 "$DIR/w0.log") / $(tail -2 "$DIR/w1b.log")"
done
grep -q "worker 1: error-feedback residuals restored from $DIR/w1.state" "$DIR/w1b.log" ||
  fail "the returning worker 1 did not restore its state file: $(head -3 "$DIR/w1b.log")"
grep -q "^worker 1 done: 1500 steps" "$DIR/w1b.log" ||
  fail "the returning worker 1 did not finish the job: $(tail -2 "$DIR/w1b.log")"
grep -q "^worker 0 done: 1500 steps" "$DIR/w0.log" ||
  fail "worker 0 did not finish the job: $(tail -2 "$DIR/w0.log")"
echo "ok: worker 1 came back and both finished 1500 steps"

# --- 4. Without the flag SIGTERM ends the daemon ---------------------------
"$SERVER" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --port_file="$DIR/port1" --num_workers=1 \
  --optimizer=adam --pull_codec=fp32 >"$DIR/shard1.log" 2>&1 &
PIDS+=($!)
wait_for "the second shard's port file" 10 test -s "$DIR/port1"
SERVERS="127.0.0.1:$(cat "$DIR/port1")"
worker 0 plain.log --steps=100000 --num_workers=1; W0=$LAST
wait_for "the plain worker's first progress line" 30 grep -q "step [1-9]" "$DIR/plain.log"
kill -TERM "$W0"
code=0; wait "$W0" || code=$?
[[ $code == 143 ]] || fail "without --leave_on_sigterm SIGTERM gave exit $code; expected 143"
! grep -q "left the job" "$DIR/plain.log" || fail "a worker without --leave_on_sigterm left the job"
echo "ok: without the flag SIGTERM ends it (exit 143)"
echo "PASS: pserver_worker --leave_on_sigterm"
