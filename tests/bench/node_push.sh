#!/usr/bin/env bash
# One push per machine against one push per worker (issue 48 section 2; a
# benchmark, not a unit test; needs root). N machines (each of MACHINES),
# each a network namespace with 2 workers and its shard (co-located: the
# launcher's default with --nnodes), every machine's link shaped to RATE
# both ways with tc tbf (tests/bench/netns_lib.sh). The language model of
# the LM benchmarks (python/examples/train_gpt.py --size bench) for STEPS
# steps, run with the same launch command on every machine. Rows:
#   ddp_fp32        train_gpt.py --ddp fp32 over gloo, the 2N ranks started
#                   as torchrun starts them (rank 0's store on machine 0)
#   ps_fp32_flat    pserver.launch --optimizer adam --pull-codec fp32
#   ps_fp32_node    the same with --push-per node
#   ps_onebit_flat  pserver.launch --recipe lm-onebit:FREEZE (1-bit both
#                   ways after round FREEZE)
#   ps_onebit_node  the same with --push-per node
# Measured in a window of the run, from rank 0's "step FROM/" line to its
# "step STEPS/" line (after the freeze, past start-up): the bytes on each
# machine's link (tc, both directions) per step, the seconds per step, and
# the CPU seconds per step of all of each machine's processes (their
# /proc stat); on one 2-core box every namespace shares the cores, so a
# row whose CPU per step approaches 2 x its seconds per step is CPU-bound.
# The report (tests/bench/node_push_report.py): medians over REPEATS runs
# (seeds 1..REPEATS), flat over node per machine, into OUT/node_push.md and
# node_push.json with the commit and machine (tests/bench/provenance.py).
#
#   sudo tests/bench/node_push.sh                   # into results/node_push/
#   sudo tests/bench/node_push.sh --results         # into tests/bench/results/
#   sudo MACHINES=2 ROWS="ps_onebit_flat ps_onebit_node" REPEATS=1 tests/bench/node_push.sh
#
# Variables (defaults): MACHINES="2 4", ROWS (all five above), REPEATS=3,
# STEPS=60, FROM=20, FREEZE=10, RATE=100mbit, BUILD_DIR=build,
# WORK=results/node_push/runs (a run is redone), OUT=results/node_push,
# PYTHON=/usr/bin/python3, ALLOW_DIRTY=0. Everything it creates is removed
# on every exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
OUT="${OUT:-$ROOT/results/node_push}"
die() { echo "node_push.sh: $*" >&2; exit 2; }
case "${1:-}" in
  --results) OUT="$ROOT/tests/bench/results" ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "unknown option '$1' (see --help)" ;;
esac
WORK="${WORK:-$ROOT/results/node_push/runs}"
MACHINES="${MACHINES:-2 4}"
ROWS="${ROWS:-ddp_fp32 ps_fp32_flat ps_fp32_node ps_onebit_flat ps_onebit_node}"
REPEATS="${REPEATS:-3}" STEPS="${STEPS:-60}" FROM="${FROM:-20}"
FREEZE="${FREEZE:-10}" RATE="${RATE:-100mbit}"
PYTHON="${PYTHON:-/usr/bin/python3}"
SERVER="$BUILD/server/pserver_server"
PYDIR="$BUILD/python"
GPT="$ROOT/python/examples/train_gpt.py"
[[ -x "$SERVER" ]] || die "no pserver_server at $SERVER; build first"
ls "$PYDIR"/pserver/_native*.so >/dev/null 2>&1 || die "no pserver package in $PYDIR"
(( FROM < STEPS )) || die "FROM ($FROM) must be below STEPS ($STEPS)"
mkdir -p "$WORK" "$OUT"
# The commit and machine, before anything runs (refuses a dirty tree).
"$PYTHON" "$ROOT/tests/bench/provenance.py" \
  $([[ ${ALLOW_DIRTY:-0} == 1 ]] && echo --allow-dirty) >"$WORK/provenance.json"
NETNS_PROG=node_push
NETNS_LOG_DIR="$WORK"
# shellcheck source=netns_lib.sh
source "$ROOT/tests/bench/netns_lib.sh"
netns_check_tools
TICK=$(getconf CLK_TCK)

# cpu_seconds NS: the CPU seconds so far of every process in namespace NS.
cpu_seconds() {
  local pid total=0 t
  for pid in $(ip netns pids "$TAG-$1"); do
    t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null) || continue
    total=$((total + t))
  done
  echo "$((total * 1000 / TICK))"  # milliseconds
}

# snapshot FILE: the time, each machine's link bytes and CPU.
snapshot() {
  local h
  tc_bytes "$1.tc"
  { echo "time $(date +%s.%N)"
    for h in "${HOSTS[@]}"; do echo "$h cpu_ms $(cpu_seconds "$h")"; done
  } >"$1"
}

# await_line FILE TEXT PIDS...: until FILE has TEXT, or a PID is gone.
await_line() {
  local file=$1 text=$2 pid
  shift 2
  until grep -qF -- "$text" "$file" 2>/dev/null; do
    for pid in "$@"; do
      kill -0 "$pid" 2>/dev/null || fail "a launcher exited before '$text' ($file: $(tail -3 "$file"))"
    done
    sleep 0.05
  done
}

# run N ROW SEED RD: the job on N machines; the window's snapshots in RD.
run() {
  local n=$1 row=$2 seed=$3 rd=$4 r l
  local -a pids=() gpt=("$GPT" --size bench --steps "$STEPS" --log-every 5 --seed "$seed")
  local endpoint=198.18.48.1 port=$((29400 + RANDOM % 500))
  rm -rf "$rd"; mkdir -p "$rd"
  for ((r = 0; r < n; r++)); do
    if [[ $row == ddp_fp32 ]]; then
      for l in 0 1; do
        ip netns exec "$TAG-m$r" env PYTHONPATH="$PYDIR" OMP_NUM_THREADS=1 \
          RANK=$((2 * r + l)) WORLD_SIZE=$((2 * n)) LOCAL_RANK=$l LOCAL_WORLD_SIZE=2 \
          GROUP_RANK=$r MASTER_ADDR=$endpoint MASTER_PORT=$port GLOO_SOCKET_IFNAME=eth0 \
          "$PYTHON" "${gpt[@]}" --ddp fp32 >"$rd/launch$r.$l.log" 2>&1 &
        pids+=($!); PIDS+=($!)
      done
      ln -sf "launch$r.0.log" "$rd/launch$r.log"
      continue
    fi
    local -a flags=(--optimizer adam --pull-codec fp32)
    [[ $row == ps_onebit_* ]] && flags=(--recipe "lm-onebit:$FREEZE")
    [[ $row == *_node ]] && flags+=(--push-per node)
    ip netns exec "$TAG-m$r" env PYTHONPATH="$PYDIR" PYTHONDONTWRITEBYTECODE=1 \
      "$PYTHON" -m pserver.launch --server-bin "$SERVER" --run-dir "$rd/m$r" \
      --nnodes "$n" --node-rank "$r" --nproc-per-node 2 \
      --rdzv-endpoint "$endpoint:$port" "${flags[@]}" \
      "${gpt[@]}" --pserver >"$rd/launch$r.log" 2>&1 &
    pids+=($!); PIDS+=($!)
  done
  await_line "$rd/launch0.log" "step $FROM/$STEPS " "${pids[@]}"
  snapshot "$rd/from"
  await_line "$rd/launch0.log" "step $STEPS/$STEPS " "${pids[@]}"
  snapshot "$rd/to"
  wait_pids 600 "$row on $n machines, seed $seed" "${pids[@]}"
  grep -h "final_val_loss" "$rd/launch0.log" >"$rd/final" || true
}

most=0
for n in $MACHINES; do (( n > most )) && most=$n; done
netns_start "np$$"
for ((r = 0; r < most; r++)); do netns_host "m$r" "198.18.48.$((r + 1))"; done
netns_shape "$RATE" "$(netns_default_burst "$(netns_rate_bps "$RATE")")" 50ms
for n in $MACHINES; do
  for row in $ROWS; do
    for ((seed = 1; seed <= REPEATS; seed++)); do
      echo "node_push.sh: $n machines x 2 workers at $RATE: $row seed $seed" >&2
      run "$n" "$row" "$seed" "$WORK/$n/$row/$seed"
    done
  done
done
"$PYTHON" "$ROOT/tests/bench/node_push_report.py" --work "$WORK" --out "$OUT" \
  --steps "$((STEPS - FROM))" --rate "$RATE"
