#!/usr/bin/env bash
# Time-to-loss benchmark (not a unit test; needs root; issue 29 section 1):
# the language model of the LM fidelity benchmark (python/examples/
# train_gpt.py --size bench, the recipe of RECIPE in tests/bench/
# lm_fidelity.py) trained on shaped links until it reaches a target
# validation loss: adamw's mean final loss in tests/bench/results/
# lm_fidelity.json plus 2%. Two shard hosts and four worker hosts, each a
# network namespace on one bridge, every host's link shaped with tc tbf both
# ways (tests/bench/netns_lib.sh), at each rate of RATES. Rows
# (tests/bench/time_to_loss.py's ROWS):
#   ddp_fp32, ddp_fp16, ddp_powersgd   train_gpt.py --ddp on the 4 worker
#                     hosts over gloo (rank 0's store on the first)
#   ps_fp32, ps_onebit, ps_topk, diloco_h16_q8, diloco_h16_onebit,
#   diloco_h16_q2_wm, diloco_h16_q2_b085, localsgd_h4_q8
#                     train_gpt.py --pserver on the worker hosts, pserver_server
#                     on the shard hosts, lm_fidelity.py's rows (the local-step
#                     ones with a 600 s lease; _wm: the workers keep the outer
#                     momentum; localsgd_h4_q8: 4 local steps, the shards
#                     average the models, 8-bit both ways)
#   ps_onebit_colocated, ps_topk_colocated
#                     the same as ps_onebit and ps_topk with 4 shards, one on
#                     each worker's host (BytePS's layout; in the default
#                     RUNS too)
# Each run stops at the first evaluation at or below the target, or past
# CAP seconds of training; then the other processes are stopped. Per row
# and rate: the training seconds to the target (median over REPEATS runs,
# seeds 1..REPEATS), the step time, the bytes on the busiest link (tc) and
# the CPU seconds per step of each process (/usr/bin/time), the speed-up
# against ddp_fp32 and met/MISSED against issue 29's targets: OUT/
# time_to_loss.md, time_to_loss.json and time_to_loss_<rate>.svg (validation
# loss against training seconds). Takes many hours with the defaults.
#
#   sudo tests/bench/time_to_loss.sh                  # the report into results/time_to_loss/
#   sudo tests/bench/time_to_loss.sh --results        # into tests/bench/results/
#   sudo tests/bench/time_to_loss.sh --report-only    # the report again from WORK
#   sudo RATES=100mbit RUNS="ddp_fp32 ps_onebit" REPEATS=1 tests/bench/time_to_loss.sh
#
# Options: --results (write to tests/bench/results), --out DIR, --work DIR,
# --build DIR (default build/, as BUILD_DIR), --report-only, --help,
# --restore FILE (first the runs of a report's time_to_loss.json into WORK,
# where WORK has none of its own: to add rows or seeds to a committed table
# on another machine, e.g. --restore tests/bench/results/time_to_loss.json).
# Variables (defaults):
#   RATES="100mbit 1gbit"  link rates each way, tc units (bit, kbit, mbit, gbit)
#   RUNS="ddp_fp32 ddp_fp16 ddp_powersgd ps_fp32 ps_onebit ps_topk diloco_h16_q8 diloco_h16_onebit diloco_h16_q2_wm diloco_h16_q2_b085 localsgd_h4_q8 ps_onebit_colocated ps_topk_colocated"
#   REPEATS=3         runs per row and rate
#   CAP=1500          seconds of training after which a run stops unreached
#                     (at its next evaluation: train_gpt.py --max-seconds)
#   EVAL_EVERY=100    steps between rank 0's evaluations (where it may stop)
#   RUN_TIMEOUT=CAP+900  wall seconds a run may take before it is failed
#   BURST (bytes; default 2 ms at the rate, at least 64 KiB), TBF_LATENCY=50ms
#   WORK=results/time_to_loss/runs  each run's folder, WORK/<rate>/<row>/<seed>/;
#                     a run whose result.json has the same settings is reused,
#                     so an interrupted benchmark continues with the same WORK
#   OUT=results/time_to_loss  the report's folder
#   REFERENCE=tests/bench/results/lm_fidelity.json  where the target comes from
#   PYTHON=/usr/bin/python3 (with torch)
#   ALLOW_DIRTY=1     plan runs from a tree with uncommitted changes (refused
#                     otherwise; the table says so)
#   Smoke tests only (the report says so): STEPS (instead of the recipe's
#   2000), TARGET (a loss instead of adamw's + 2%), e.g.
#   RATES=100mbit RUNS="ddp_fp32 ps_onebit" REPEATS=1 STEPS=40 EVAL_EVERY=20 TARGET=3.3 CAP=60
# Everything it creates (namespaces, the bridge, the processes) is removed on
# every exit. Threads: one per process, OpenBLAS's Haswell kernel unless
# OPENBLAS_CORETYPE says otherwise (as lm_fidelity.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
OUT="${OUT:-$ROOT/results/time_to_loss}"
WORK="${WORK:-$ROOT/results/time_to_loss/runs}"
report_only=0
RESTORE=""
die() { echo "time_to_loss.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --results) OUT="$ROOT/tests/bench/results"; shift ;;
    --out) [[ $# -ge 2 && -n "$2" ]] || die "--out needs a folder"; OUT="$2"; shift 2 ;;
    --work) [[ $# -ge 2 && -n "$2" ]] || die "--work needs a folder"; WORK="$2"; shift 2 ;;
    --build) [[ $# -ge 2 && -n "$2" ]] || die "--build needs a folder"; BUILD="$2"; shift 2 ;;
    --report-only) report_only=1; shift ;;
    --restore) [[ $# -ge 2 && -f "$2" ]] || die "--restore needs a report's time_to_loss.json"; RESTORE="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'; expected --results, --out DIR, --work DIR, --build DIR, --restore FILE, --report-only or --help" ;;
  esac
done

RATES="${RATES:-100mbit 1gbit}"
RUNS="${RUNS:-ddp_fp32 ddp_fp16 ddp_powersgd ps_fp32 ps_onebit ps_topk diloco_h16_q8 diloco_h16_onebit diloco_h16_q2_wm diloco_h16_q2_b085 localsgd_h4_q8 ps_onebit_colocated ps_topk_colocated}"
REPEATS="${REPEATS:-3}"
CAP="${CAP:-1500}"
EVAL_EVERY="${EVAL_EVERY:-100}"
RUN_TIMEOUT="${RUN_TIMEOUT:-$((CAP + 900))}"
TBF_LATENCY="${TBF_LATENCY:-50ms}"
REFERENCE="${REFERENCE:-$ROOT/tests/bench/results/lm_fidelity.json}"
PYTHON="${PYTHON:-/usr/bin/python3}"
STEPS="${STEPS:-}"
TARGET="${TARGET:-}"
SERVER="$BUILD/server/pserver_server"
HERE="$ROOT/tests/bench"
# shellcheck source-path=SCRIPTDIR source=netns_lib.sh
source "$HERE/netns_lib.sh"
NETNS_PROG=time_to_loss.sh

# Preconditions, each with one line saying what is wrong.
for n in REPEATS CAP EVAL_EVERY RUN_TIMEOUT ${STEPS:+STEPS}; do
  [[ "${!n}" =~ ^[0-9]+$ && "${!n}" -gt 0 ]] || die "$n is '${!n}'; expected a positive integer"
done
[[ -z "$TARGET" || "$TARGET" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "TARGET is '$TARGET'; expected a loss like 1.63"
[[ -n "${RUNS// /}" ]] || die "RUNS is empty; expected some of the rows in time_to_loss.py's ROWS"
[[ -x "$PYTHON" ]] || die "$PYTHON not found; the runs and the report need it"
"$PYTHON" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
  die "$PYTHON has no torch with gloo (apt-get install python3-torch)"
ls "$BUILD"/python/pserver/_native*.so >/dev/null 2>&1 ||
  die "no Python extension in $BUILD/python/pserver; build first (tests/run.sh) or pass --build DIR"
[[ -n "$TARGET" || -f "$REFERENCE" ]] ||
  die "no $REFERENCE (the target is adamw's loss there + 2%); run tests/bench/lm_fidelity.sh --results first"
rate_list=""  # NAME:BIT_PER_S:BURST ...
for rate in $RATES; do
  bps=$(netns_rate_bps "$rate") || die "RATES has '$rate'; expected a number with bit, kbit, mbit or gbit (like 1gbit)"
  (( bps >= 1000000 )) || die "RATES has '$rate'; expected at least 1mbit"
  burst="${BURST:-$(netns_default_burst "$bps")}"
  [[ "$burst" =~ ^[0-9]+$ ]] || die "BURST is '$burst'; expected bytes, a positive integer"
  rate_list+="$rate:$bps:$burst "
done
if [[ $report_only == 0 ]]; then
  netns_check_tools
  [[ -x /usr/bin/time ]] || die "/usr/bin/time not found (apt-get install time); it measures each process's CPU seconds"
  command -v pgrep >/dev/null || die "pgrep not found (apt-get install procps)"
  [[ -x "$SERVER" ]] || die "no $SERVER; build it first (tests/run.sh) or pass --build DIR"
fi

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$WORK" "$OUT"
WORK="$(cd "$WORK" && pwd)"
OUT="$(cd "$OUT" && pwd)"
settings=(--work "$WORK" --rates "$rate_list" --runs "$RUNS" --repeats "$REPEATS" --cap "$CAP"
          --eval-every "$EVAL_EVERY" --tbf-latency "$TBF_LATENCY" --reference "$REFERENCE"
          ${STEPS:+--steps "$STEPS"} ${TARGET:+--target "$TARGET"})
if [[ -n "$RESTORE" ]]; then
  "$PYTHON" "$HERE/time_to_loss.py" restore --work "$WORK" --source "$RESTORE" ||
    die "could not restore the runs of $RESTORE"
fi
report() {
  "$PYTHON" "$HERE/time_to_loss.py" report "${settings[@]}" --out "$OUT"
}
if [[ $report_only == 1 ]]; then
  report
  exit
fi

todo=$("$PYTHON" "$HERE/time_to_loss.py" plan "${settings[@]}" \
  $([[ ${ALLOW_DIRTY:-0} == 1 ]] && echo --allow-dirty)) || die "time_to_loss.py plan failed"

NETNS_LOG_DIR="$WORK"
netns_start "ptl$$"  # every name made here starts with it
SHARD_IP=(198.18.1.10 198.18.1.11)
WORKER_IP=(198.18.1.20 198.18.1.21 198.18.1.22 198.18.1.23)
for s in 0 1; do netns_host "s$s" "${SHARD_IP[$s]}"; done
for w in 0 1 2 3; do netns_host "w$w" "${WORKER_IP[$w]}"; done

# launch RD HOST NAME VAR=VALUE... -- COMMAND...: COMMAND in HOST's
# namespace, in the background under /usr/bin/time (its wall, user and
# system seconds into RD/cpu.NAME), its output in RD/NAME.log. Sets TIMER
# (the time process: wait on it for the exit status) and PROC (the command:
# signal it; time does not pass signals on).
launch() {
  local rd=$1 host=$2 name=$3
  local -a envs=()
  shift 3
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  ip netns exec "$TAG-$host" env "${envs[@]}" /usr/bin/time -f '%e %U %S' -o "$rd/cpu.$name" \
    "$@" >"$rd/$name.log" 2>&1 &
  TIMER=$!
  PIDS+=("$TIMER")
  PROC=""
  for _ in $(seq 200); do
    PROC=$(pgrep -P "$TIMER" || true)
    [[ -n "$PROC" ]] && return
    kill -0 "$TIMER" 2>/dev/null || break
    sleep 0.05
  done
  fail "$name: no process under /usr/bin/time (see $rd/$name.log)"
}

# The two kinds of run, each in a subshell of its own: fail ends the run,
# the caller then kills what is left in the namespaces and goes on.
# run_ps RD ROW LAYOUT: shards (dedicated: on the 2 shard hosts;
# colocated: shard i on worker i's host), then workers; done when rank 0
# exits 0.
run_ps() {
  local rd=$1 row=$2 layout=$3 s w i
  local -a sflags wargs timers=() procs=() names=() shost sip
  case $layout in
    colocated) shost=(w0 w1 w2 w3); sip=("${WORKER_IP[@]}") ;;
    dedicated) shost=(s0 s1); sip=("${SHARD_IP[@]}") ;;
    *) fail "$row: layout '$layout'; expected dedicated or colocated (time_to_loss.py plan)" ;;
  esac
  local ns=${#sip[@]} servers
  servers=$(printf '%s:50051,' "${sip[@]}"); servers=${servers%,}
  mapfile -t sflags <"$rd/shard.args"
  mapfile -t wargs <"$rd/worker.args"
  tc_bytes "$rd/tc.before"
  for ((s = 0; s < ns; s++)); do
    launch "$rd" "${shost[$s]}" "s$s" -- "$SERVER" --shard_index=$s --num_shards="$ns" \
      --num_workers=4 --listen="${sip[$s]}:50051" --port_file="$rd/shard$s.port" "${sflags[@]}"
    timers+=("$TIMER"); procs+=("$PROC"); names+=("shard $s")
  done
  for ((s = 0; s < ns; s++)); do
    for _ in $(seq 300); do [[ -s "$rd/shard$s.port" ]] && break; sleep 0.1; done
    [[ -s "$rd/shard$s.port" ]] || fail "$row: shard $s not listening after 30 s"
  done
  for w in 0 1 2 3; do
    launch "$rd" "w$w" "w$w" RANK=$w WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      PSERVER_SERVERS="$servers" -- "$PYTHON" "${wargs[@]}" --json "$rd/train.json"
    timers+=("$TIMER"); procs+=("$PROC"); names+=("worker $w")
  done
  # Rank 0 (timers[ns]) decides when the run ends. The shards must outlive
  # it; the other workers end first, with 0, only when every step was done
  # (rank 0 then evaluates once more).
  local deadline=$((SECONDS + RUN_TIMEOUT)) code=0 r0=$ns
  local -A ended=()
  while kill -0 "${timers[$r0]}" 2>/dev/null; do
    for ((i = 0; i < ns + 4; i++)); do
      (( i != r0 )) || continue
      if [[ -n "${ended[$i]:-}" ]] || kill -0 "${timers[$i]}" 2>/dev/null; then continue; fi
      (( i > r0 )) || fail "$row: ${names[$i]} exited before rank 0"
      wait "${timers[$i]}" || code=$?
      [[ $code -eq 0 ]] || fail "$row: ${names[$i]} exited with code $code before rank 0"
      ended[$i]=1
    done
    (( SECONDS < deadline )) || fail "$row: still running after $RUN_TIMEOUT s (raise RUN_TIMEOUT)"
    sleep 0.5
  done
  wait "${timers[$r0]}" || code=$?
  [[ $code -eq 0 ]] || fail "$row: rank 0 exited with code $code"
  tc_bytes "$rd/tc.after"
  # Workers first (they wait on the shards), then the shards; each under
  # time, which writes its file when its process is gone.
  stop_pids "${procs[@]:r0+1}"
  stop_pids "${procs[@]:0:ns}"
  for ((i = 0; i < ns + 4; i++)); do
    (( i == r0 )) || wait "${timers[$i]}" 2>/dev/null || true
  done
}

# run_ddp RD ROW PORT: the four ranks, rank 0's store on PORT of w0; done
# when every rank exits 0 (they stop together).
run_ddp() {
  local rd=$1 row=$2 port=$3 w
  local -a wargs timers=()
  mapfile -t wargs <"$rd/worker.args"
  tc_bytes "$rd/tc.before"
  for w in 0 1 2 3; do
    launch "$rd" "w$w" "w$w" RANK=$w WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="${WORKER_IP[0]}" MASTER_PORT="$port" GLOO_SOCKET_IFNAME=eth0 -- \
      "$PYTHON" "${wargs[@]}" --json "$rd/train.json"
    timers+=("$TIMER")
  done
  wait_pids "$RUN_TIMEOUT" "$row: ranks" "${timers[@]}"
  tc_bytes "$rd/tc.after"
}

echo "time_to_loss.sh: 4 worker hosts and 2 shard hosts (the *_colocated rows: a shard on each worker host), links $RATES (tbf each way); rows $RUNS;" \
  "$REPEATS run(s) each; cap $CAP s; work in $WORK" >&2
shaped="" port=29500 failed=0
while read -r -u 3 seed rate row kind layout rd; do
  [[ -n "$seed" ]] || continue
  if [[ "$rate" != "$shaped" ]]; then
    for entry in $rate_list; do
      [[ "${entry%%:*}" == "$rate" ]] && netns_shape "$rate" "${entry##*:}" "$TBF_LATENCY"
    done
    shaped=$rate
  fi
  echo "time_to_loss.sh: $rate $row seed $seed ..." >&2
  rm -f "$rd"/train.json "$rd"/result.json "$rd"/cpu.* "$rd"/tc.* "$rd"/*.port "$rd"/*.log
  NETNS_LOG_DIR="$rd"
  start=$SECONDS
  set +e
  if [[ $kind == ps ]]; then
    (set -e; run_ps "$rd" "$row" "$layout")
  else
    (set -e; run_ddp "$rd" "$row" "$port")
  fi
  code=$?
  set -e
  port=$((port + 1))
  netns_kill_all  # what a failed run left behind
  if [[ $code -eq 0 ]]; then
    "$PYTHON" "$HERE/time_to_loss.py" collect --dir "$rd" || code=$?
  fi
  if [[ $code -ne 0 ]]; then
    failed=$((failed + 1))
    echo "time_to_loss.sh: FAILED $rate $row seed $seed (logs in $rd):" >&2
    for f in "$rd"/*.log; do [[ -f "$f" ]] && { echo "== $f"; tail -5 "$f"; }; done >&2
  fi
  echo "time_to_loss.sh: $rate $row seed $seed took $((SECONDS - start)) s" >&2
done 3<<<"$todo"
NETNS_LOG_DIR="$WORK"

code=0
report || code=$?
(( failed == 0 )) || echo "time_to_loss.sh: $failed run(s) failed; see above" >&2
(( failed == 0 && code == 0 )) || exit 1
