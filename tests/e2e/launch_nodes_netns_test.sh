#!/usr/bin/env bash
# Several machines in network namespaces (issue 48): two namespaces on a
# bridge, each link shaped to 100 Mbit/s, each a "machine" running the same
# `python3 -m pserver.launch --nnodes 2 --nproc-per-node 2 --rdzv-endpoint
# ...` command with its own --node-rank: one shard and two workers each,
# meeting at node 0's TCPStore across the bridge.
#   1. A 4-worker job trains to the end: every rank at the same step, each
#      with both shards, and traffic on both machines' links both ways.
#   2. The job again with --push-per node: each machine's two workers
#      average inside it and push once; every rank ends at the same step,
#      and each link carries fewer bytes than in 1.
#   3. The same job with machine 1 killed outright (every process in its
#      namespace SIGKILLed, as a machine that loses power): machine 0's
#      launcher exits 1 within seconds naming node 1, and nothing is left
#      running in either namespace.
# Traffic stays inside the namespaces; everything is removed on any exit.
#
#   tests/e2e/launch_nodes_netns_test.sh SERVER_BIN PYTHON_DIR
set -euo pipefail
SERVER="$1"; PYDIR="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORKER_SCRIPT="$ROOT/python/tests/launch_worker.py"
NETNS_PROG=launch_nodes_netns_test
die() { echo "$NETNS_PROG: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root for ip netns"; exit 77; }
[[ -x "$SERVER" ]] || die "no pserver_server at '$SERVER'"
ls "$PYDIR"/pserver/_native*.so >/dev/null 2>&1 ||
  die "no pserver package built in '$PYDIR'"
# shellcheck source=../bench/netns_lib.sh
source "$ROOT/tests/bench/netns_lib.sh"
netns_check_tools
NETNS_LOG_DIR="$(mktemp -d /tmp/pserver-nodes.XXXXXX)"
netns_start "pn$$"
netns_host m0 198.18.40.1
netns_host m1 198.18.40.2
netns_shape 100mbit "$(netns_default_burst 100000000)" 50ms
ENDPOINT=198.18.40.1:29400

# launch NODE RUN SCRIPT_ARGS...: machine NODE's launcher (with the options
# in EXTRA) in the background,
# its pid in LAUNCHER[NODE], its output in RUN/launch<NODE>.log.
LAUNCHER=()
EXTRA=()
launch() {
  local r=$1 run=$2
  shift 2
  ip netns exec "$TAG-m$r" env PYTHONPATH="$PYDIR" PYTHONDONTWRITEBYTECODE=1 \
    /usr/bin/python3 -m pserver.launch --server-bin "$SERVER" \
    --run-dir "$run/m$r" --nnodes 2 --node-rank "$r" --nproc-per-node 2 \
    --rdzv-endpoint "$ENDPOINT" --heartbeat-timeout 3 --join-timeout 60 \
    "${EXTRA[@]}" "$WORKER_SCRIPT" "$run/out" "$@" >"$run/launch$r.log" 2>&1 &
  LAUNCHER[$r]=$!
  PIDS+=($!)
}

# exit_code PID LIMIT: waits up to LIMIT s for PID (a child of this shell);
# its exit status in CODE.
CODE=0
exit_code() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null; do
    (( SECONDS < deadline )) || fail "pid $1 still running after $2 s"
    sleep 0.2
  done
  CODE=0
  wait "$1" || CODE=$?
}

nothing_left() {
  local ns left
  for ns in "$TAG-m0" "$TAG-m1"; do
    left="$(ip netns pids "$ns" | tr '\n' ' ')"
    [[ -z "$left" ]] || fail "still running in $ns: $left ($(ps -o comm= -p ${left// /,} | tr '\n' ' '))"
  done
}

# train RUN WHAT LAUNCHER_OPTION...: a 20-step job of 4 workers on both
# machines; every rank at step 20 with both shards.
train() {
  local run=$1 what=$2 r rank got
  shift 2
  mkdir -p "$run/out"
  EXTRA=("$@")
  launch 0 "$run" 20
  launch 1 "$run" 20
  EXTRA=()
  for r in 0 1; do
    exit_code "${LAUNCHER[$r]}" 180
    [[ $CODE == 0 ]] || fail "$what: machine $r's launcher exited $CODE: $(tail -3 "$run/launch$r.log")"
  done
  for rank in 0 1 2 3; do
    got="$(cat "$run/out/rank$rank.txt")"
    # RANK WORLD_SIZE LOCAL_RANK shards step
    [[ $got == "$rank 4 $((rank % 2)) 2 20" ]] || fail "$what: rank $rank wrote '$got'; expected '$rank 4 $((rank % 2)) 2 20'"
  done
}

echo "$NETNS_PROG: 1. a job on both machines (logs in $NETNS_LOG_DIR)"
RUN="$NETNS_LOG_DIR/train"
train "$RUN" "one push per worker"
tc_bytes "$RUN/bytes"
while read -r host way bytes; do
  (( bytes > 20000 )) || fail "$host's link carried $bytes bytes $way; expected the other machine's pushes and pulls"
done <"$RUN/bytes"
echo "$NETNS_PROG: trained on 2 machines x 2 workers; link bytes: $(tr '\n' ' ' <"$RUN/bytes")"
nothing_left
flat_bytes="$RUN/bytes"

echo "$NETNS_PROG: 2. one push per machine"
RUN="$NETNS_LOG_DIR/node"
mkdir -p "$RUN"
tc_bytes "$RUN/before"
train "$RUN" "--push-per node" --push-per node
tc_bytes "$RUN/after"
# Bytes of this job on each link and way: after - before, against job 1's.
paste "$RUN/before" "$RUN/after" "$flat_bytes" | while read -r host way b _ _ a _ _ flat; do
  (( a - b < flat )) || fail "--push-per node: $host's link carried $((a - b)) bytes $way; expected fewer than the flat job's $flat"
  echo "$host $way $((a - b)) (flat $flat)"
done >"$RUN/bytes" || fail "$(cat "$RUN/bytes")"
echo "$NETNS_PROG: one push per machine trained; link bytes against flat: $(tr '\n' ' ' <"$RUN/bytes")"
nothing_left

echo "$NETNS_PROG: 3. machine 1 dies"
RUN="$NETNS_LOG_DIR/kill"
mkdir -p "$RUN/out"
launch 0 "$RUN" 1000000
launch 1 "$RUN" 1000000
deadline=$((SECONDS + 120))
until [[ -f "$RUN/m1/pids" && $(wc -w <"$RUN/m1/pids") -ge 6 &&
         -f "$RUN/m0/pids" && $(wc -w <"$RUN/m0/pids") -ge 6 ]]; do
  (( SECONDS < deadline )) || fail "the job did not start on both machines in 120 s"
  sleep 0.1
done
sleep 2  # training
for pid in $(ip netns pids "$TAG-m1"); do kill -9 "$pid" 2>/dev/null || true; done
killed=$SECONDS
exit_code "${LAUNCHER[0]}" 60
took=$((SECONDS - killed))
wait "${LAUNCHER[1]}" 2>/dev/null || true
[[ $CODE == 1 ]] || fail "machine 0's launcher exited $CODE; expected 1: $(tail -3 "$RUN/launch0.log")"
grep -q "node 1 stopped answering: its launcher has not been heard from for 3 s" "$RUN/launch0.log" ||
  fail "machine 0 did not name node 1: $(tail -3 "$RUN/launch0.log")"
(( took <= 20 )) || fail "machine 0 stopped $took s after machine 1 died; expected seconds"
nothing_left
echo "$NETNS_PROG: machine 0 stopped $took s after machine 1 died, naming it; nothing left running"
echo "$NETNS_PROG: PASS"
