#!/usr/bin/env bash
# Network benchmark (not a unit test; needs root): the real daemons on
# shaped links. Two shard hosts and four worker hosts, each a network
# namespace with a veth onto one Linux bridge (in a hub namespace of its
# own); every host's link is shaped with tc tbf in both directions (egress on
# the hub's end of the veth = into the host, egress inside the host = out of
# it), RATE each way (tests/bench/netns_lib.sh). LAYOUT=colocated drops the
# shard hosts and runs one shard on each worker host instead (BytePS's
# layout: 4 shards, 4 hosts, each a shard and a worker, every link shaped the
# same); the DDP runs do not change with it. On it:
#   fp32    pserver, --optimizer=adam, fp32 pushes and pulls
#   onebit  pserver, 1-bit Adam as deploy/local.sh runs it (--optimizer=
#           onebit_adam, bf16 pushes in its warmup, then 1-bit pushes; 1-bit
#           pulls), v frozen after FREEZE_STEP rounds
#   topk    pserver, the same 1-bit Adam with TopK pushes (K_FRACTION) and
#           1-bit pulls
#   ddp_fp32, ddp_fp16, ddp_powersgd
#           PyTorch DDP over gloo on the four worker hosts (rank r on worker
#           host r, rank 0's store on the first), same parameter count:
#           DDP's allreduce, fp16_compress_hook, PowerSGD rank 4
#           (tests/bench/network_ddp.py)
# Every pserver run trains pserver_worker's synthetic model (PARAMS
# parameters in TENSORS tensors, seeded random gradients) for STEPS steps.
# For each run it reports the median step after the first DROP steps, the
# average step over the whole run (warmup included), bytes per worker per
# step, the run's wire-time limit (bytes its busiest link must carry per
# step / RATE) and step / limit, the CPU seconds per step of the workers
# and the busiest shard (workers: their own per-step CPU; shards: their
# process_cpu_seconds_total between step DROP and the end, from /metrics),
# and from these an estimate of the step on dedicated hosts (every process
# on cores of its own; network_report.py gives the model): a table on
# stdout, network.md, network.json and network.svg. Takes about 10 minutes
# with the defaults.
#
#   sudo tests/bench/network.sh                     # results in a new /tmp/pserver-network.* folder
#   sudo tests/bench/network.sh --results           # into tests/bench/results/
#   sudo RATE=100mbit PARAMS=2000000 RUNS="fp32 onebit" tests/bench/network.sh
#   sudo LAYOUT=colocated RUNS="fp32 onebit topk" tests/bench/network.sh --results
#
# Options: --results (write to tests/bench/results), --out DIR, --build DIR
# (default build/, as BUILD_DIR), --help. Variables (defaults):
#   LAYOUT=dedicated  dedicated: 2 shard hosts + 4 worker hosts; colocated: 4
#                     hosts, shard i beside worker i (results network_colocated.*)
#   RATE=1gbit        link rate each way, a tc rate in bit/s units (bit, kbit,
#                     mbit, gbit)
#   PARAMS=25000000 TENSORS=8 STEPS=30   the synthetic model and run length
#   DROP=8            steps left out of the median (warm-up: connections,
#                     1-bit Adam's fp32/bf16 warmup, PowerSGD's first steps)
#   FREEZE_STEP=4     1-bit Adam's warmup rounds (onebit, topk)
#   K_FRACTION=0.01   topk: fraction of elements pushed
#   RUNS="fp32 onebit topk ddp_fp32 ddp_fp16 ddp_powersgd"
#   RUN_TIMEOUT=120+30*STEPS seconds per run before it is killed and failed
#   BURST (bytes; default 2 ms at RATE, at least 64 KiB), TBF_LATENCY=50ms
#   PYTHON=/usr/bin/python3 (with torch, for the DDP runs)
# Everything it creates (namespaces, the bridge, the processes) is removed on
# every exit; results stay in the output folder, logs and each run's raw data
# (summary JSONs, /metrics pages, tc counters) in a /tmp folder it names.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
OUT=""
die() { echo "network.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --results) OUT="$ROOT/tests/bench/results"; shift ;;
    --out) [[ $# -ge 2 && -n "$2" ]] || die "--out needs a folder"; OUT="$2"; shift 2 ;;
    --build) [[ $# -ge 2 && -n "$2" ]] || die "--build needs a folder"; BUILD="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'; expected --results, --out DIR, --build DIR or --help" ;;
  esac
done

LAYOUT="${LAYOUT:-dedicated}"
RATE="${RATE:-1gbit}"
PARAMS="${PARAMS:-25000000}"
TENSORS="${TENSORS:-8}"
STEPS="${STEPS:-30}"
DROP="${DROP:-8}"
FREEZE_STEP="${FREEZE_STEP:-4}"
K_FRACTION="${K_FRACTION:-0.01}"
RUNS="${RUNS:-fp32 onebit topk ddp_fp32 ddp_fp16 ddp_powersgd}"
RUN_TIMEOUT="${RUN_TIMEOUT:-$((120 + 30 * STEPS))}"
TBF_LATENCY="${TBF_LATENCY:-50ms}"
PYTHON="${PYTHON:-/usr/bin/python3}"
SERVER="$BUILD/server/pserver_server"
WORKER="$BUILD/worker/pserver_worker"
HERE="$ROOT/tests/bench"
# shellcheck source-path=SCRIPTDIR source=netns_lib.sh
source "$HERE/netns_lib.sh"
NETNS_PROG=network.sh

# Preconditions, each with one line saying what is wrong.
netns_check_tools
[[ "$LAYOUT" == dedicated || "$LAYOUT" == colocated ]] ||
  die "LAYOUT is '$LAYOUT'; expected dedicated or colocated"
for n in PARAMS TENSORS STEPS DROP FREEZE_STEP RUN_TIMEOUT; do
  [[ "${!n}" =~ ^[0-9]+$ && "${!n}" -gt 0 ]] || die "$n is '${!n}'; expected a positive integer"
done
(( TENSORS <= PARAMS )) || die "TENSORS is $TENSORS; expected at most PARAMS ($PARAMS)"
(( DROP < STEPS )) || die "DROP is $DROP; expected fewer than STEPS ($STEPS) so that some steps remain"
[[ "$K_FRACTION" =~ ^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]] ||
  die "K_FRACTION is '$K_FRACTION'; expected a fraction in (0, 1] like 0.01"
[[ -n "${RUNS// /}" ]] || die "RUNS is empty; expected some of fp32 onebit topk ddp_fp32 ddp_fp16 ddp_powersgd"
RATE_BPS=$(netns_rate_bps "$RATE") ||
  die "RATE is '$RATE'; expected a number with bit, kbit, mbit or gbit (like 1gbit)"
(( RATE_BPS >= 1000000 )) || die "RATE is '$RATE'; expected at least 1mbit"
BURST="${BURST:-$(netns_default_burst "$RATE_BPS")}"
[[ "$BURST" =~ ^[0-9]+$ ]] || die "BURST is '$BURST'; expected bytes, a positive integer"
for r in $RUNS; do
  case "$r" in
    fp32|onebit|topk) [[ -x "$SERVER" && -x "$WORKER" ]] ||
      die "no $SERVER or $WORKER; build them first (cmake --build build --target pserver_server_bin pserver_worker_bin) or pass --build DIR" ;;
    ddp_fp32|ddp_fp16|ddp_powersgd)
      [[ -x "$PYTHON" ]] || die "$PYTHON not found; the DDP runs need it (or leave them out of RUNS)"
      "$PYTHON" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
        die "$PYTHON has no torch with gloo (apt-get install python3-torch), needed by $r" ;;
    *) die "RUNS has '$r'; expected fp32, onebit, topk, ddp_fp32, ddp_fp16 or ddp_powersgd" ;;
  esac
done
[[ -x "$PYTHON" ]] || die "$PYTHON not found; the report needs it"
command -v curl >/dev/null || die "curl not found (apt-get install curl); it reads the shards' CPU seconds"

DIR="$(mktemp -d /tmp/pserver-network.XXXXXX)"  # logs and raw data, kept
OUT="${OUT:-$DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

NETNS_LOG_DIR="$DIR"
netns_start "pnb$$"  # every name made here starts with it

WORKER_IP=(198.18.1.20 198.18.1.21 198.18.1.22 198.18.1.23)
if [[ $LAYOUT == dedicated ]]; then
  SHARD_HOST=(s0 s1)
  SHARD_IP=(198.18.1.10 198.18.1.11)
  for s in 0 1; do netns_host "s$s" "${SHARD_IP[$s]}"; done
else  # shard i on worker i's host, at its address (the worker's own shard is local)
  SHARD_HOST=(w0 w1 w2 w3)
  SHARD_IP=("${WORKER_IP[@]}")
fi
NUM_SHARDS=${#SHARD_HOST[@]}
SERVERS=$(printf '%s:50051,' "${SHARD_IP[@]}"); SERVERS=${SERVERS%,}
for w in 0 1 2 3; do netns_host "w$w" "${WORKER_IP[$w]}"; done
netns_shape "$RATE" "$BURST" "$TBF_LATENCY"

# scrape NS URL FILE: the metrics page, fetched from inside NS.
scrape() {
  ip netns exec "$1" "$PYTHON" -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$2" >"$3"
}

# watch_shards RD: each shard's /metrics page once its step has reached DROP
# (RD/shard<s>.drop), polled with curl from inside its namespace; the report
# takes the shard's CPU seconds per round from it and the page at the end.
watch_shards() {
  local rd=$1 s
  for ((s = 0; s < NUM_SHARDS; s++)); do
    for _ in $(seq 2400); do
      if ip netns exec "$TAG-${SHARD_HOST[$s]}" curl -sf --max-time 2 \
           "http://${SHARD_IP[$s]}:9100/metrics" -o "$rd/shard$s.drop.tmp" 2>/dev/null &&
         awk -v d="$DROP" '/^pserver_server_step[{ ]/ { if ($NF + 0 >= d) f = 1 } END { exit !f }' \
           "$rd/shard$s.drop.tmp"; then
        mv "$rd/shard$s.drop.tmp" "$rd/shard$s.drop"
        break
      fi
      sleep 0.25
    done
  done
}

# run_pserver NAME SERVER_FLAGS WORKER_FLAGS (flag strings split on spaces)
run_pserver() {
  local name=$1 rd="$DIR/$1" s w
  local -a sflags wflags spids=() wpids=()
  read -r -a sflags <<<"$2"
  read -r -a wflags <<<"$3"
  mkdir -p "$rd"
  printf 'kind=pserver\nserver_flags=%s\nworker_flags=%s\n' "$2" "$3" >"$rd/meta"
  tc_bytes "$rd/tc.before"
  for ((s = 0; s < NUM_SHARDS; s++)); do
    ip netns exec "$TAG-${SHARD_HOST[$s]}" "$SERVER" --shard_index=$s --num_shards="$NUM_SHARDS" --num_workers=4 \
      --listen="${SHARD_IP[$s]}:50051" --metrics_listen="${SHARD_IP[$s]}:9100" \
      --port_file="$rd/shard$s.port" --drain_seconds=1 "${sflags[@]}" >"$rd/shard$s.log" 2>&1 &
    spids+=($!); PIDS+=($!)
  done
  for ((s = 0; s < NUM_SHARDS; s++)); do
    for _ in $(seq 300); do [[ -s "$rd/shard$s.port" ]] && break; sleep 0.1; done
    [[ -s "$rd/shard$s.port" ]] || fail "$name: shard $s not listening after 30 s"
  done
  for w in 0 1 2 3; do
    ip netns exec "$TAG-w$w" "$WORKER" --servers="$SERVERS" \
      --worker_id=$w --num_workers=4 --model=synthetic --synthetic_params="$PARAMS" \
      --synthetic_tensors="$TENSORS" --steps="$STEPS" --progress=lines --log_interval=1000 \
      --rpc_timeout=300 --pull_timeout=600 --metrics_listen= \
      --summary_json="$rd/w$w.json" "${wflags[@]}" >"$rd/worker$w.log" 2>&1 &
    wpids+=($!); PIDS+=($!)
  done
  watch_shards "$rd" &
  local watcher=$!
  wait_pids "$RUN_TIMEOUT" "$name: workers" "${wpids[@]}"
  kill "$watcher" 2>/dev/null || true
  wait "$watcher" 2>/dev/null || true
  for ((s = 0; s < NUM_SHARDS; s++)); do
    scrape "$TAG-${SHARD_HOST[$s]}" "http://${SHARD_IP[$s]}:9100/metrics" "$rd/shard$s.metrics" ||
      fail "$name: cannot read shard $s's /metrics"
  done
  tc_bytes "$rd/tc.after"
  stop_pids "${spids[@]}"
  PIDS=()
}

# run_ddp NAME HOOK PORT
run_ddp() {
  local name=$1 rd="$DIR/$1" w
  local -a pids=()
  mkdir -p "$rd"
  printf 'kind=ddp\nhook=%s\n' "$2" >"$rd/meta"
  tc_bytes "$rd/tc.before"
  for w in 0 1 2 3; do
    GLOO_SOCKET_IFNAME=eth0 ip netns exec "$TAG-w$w" "$PYTHON" "$HERE/network_ddp.py" \
      --rank=$w --world_size=4 --master="${WORKER_IP[0]}:$3" --params="$PARAMS" \
      --tensors="$TENSORS" --steps="$STEPS" --hook="$2" --timeout="$RUN_TIMEOUT" \
      --json="$rd/r$w.json" >"$rd/rank$w.log" 2>&1 &
    pids+=($!); PIDS+=($!)
  done
  wait_pids "$RUN_TIMEOUT" "$name: ranks" "${pids[@]}"
  tc_bytes "$rd/tc.after"
  PIDS=()
}

if [[ $LAYOUT == dedicated ]]; then hosts="2 shard + 4 worker hosts"; else hosts="4 hosts, each a shard and a worker,"; fi
echo "network.sh: $hosts on a bridge, every link $RATE each way (tbf, burst $BURST B);" \
  "$PARAMS parameters in $TENSORS tensors, $STEPS steps, median after the first $DROP; runs: $RUNS" >&2
port=29500
for r in $RUNS; do
  start=$SECONDS
  case "$r" in
    fp32) run_pserver fp32 "--optimizer=adam --pull_codec=fp32" \
            "--push_codec=fp32 --warmup_codec=fp32" ;;
    onebit) run_pserver onebit "--optimizer=onebit_adam --freeze_step=$FREEZE_STEP --pull_codec=onebit" \
              "--push_codec=onebit --warmup_codec=bf16" ;;
    topk) run_pserver topk "--optimizer=onebit_adam --freeze_step=$FREEZE_STEP --pull_codec=onebit" \
            "--push_codec=topk --warmup_codec=bf16 --k_fraction=$K_FRACTION" ;;
    ddp_fp32) run_ddp ddp_fp32 fp32 $((port++)) ;;
    ddp_fp16) run_ddp ddp_fp16 fp16 $((port++)) ;;
    ddp_powersgd) run_ddp ddp_powersgd powersgd $((port++)) ;;
  esac
  echo "network.sh: $r done in $((SECONDS - start)) s" >&2
done

"$PYTHON" "$HERE/network_report.py" --runs_dir="$DIR" --runs="$RUNS" --rate_bps="$RATE_BPS" \
  --rate="$RATE" --params="$PARAMS" --tensors="$TENSORS" --steps="$STEPS" --drop="$DROP" \
  --freeze_step="$FREEZE_STEP" --k_fraction="$K_FRACTION" --burst="$BURST" --layout="$LAYOUT" --out="$OUT"
base=network; [[ $LAYOUT == dedicated ]] || base=network_$LAYOUT
echo "network.sh: wrote $OUT/$base.md, $base.json, $base.svg (logs and raw data in $DIR)" >&2
