#!/usr/bin/env bash
# Scaling benchmark (not a unit test; issue 29): the real daemons on
# loopback, every shard and worker a process of this machine, training
# pserver_worker's synthetic model (PARAMS parameters in TENSORS tensors,
# seeded random gradients) for STEPS steps, for every number of workers in
# WORKERS against every number of shards in SHARDS, each with the codecs of
# CODECS:
#   fp32    --optimizer=adam, fp32 pushes and pulls
#   onebit  1-bit Adam as tests/bench/network.sh runs it: --optimizer=
#           onebit_adam with v frozen after FREEZE_STEP rounds, bf16 pushes
#           until then and 1-bit pushes after, 1-bit pulls
# Per configuration, over the rounds after the first DROP (the measured
# window, which opens when shard 0 reports round DROP done and closes when
# the last worker has written its summary): the round time (the slowest
# worker's median step), each shard's CPU seconds, minor page faults and
# payload bytes in and out per round (/proc/PID/stat and the shards'
# /metrics counters), the workers' CPU seconds per step (/proc/PID/stat, or
# /usr/bin/time for a worker that exited before the window closed) and the
# share of the machine's cores all of them used; per shards x codec the
# round time's and the busiest shard's CPU growth per added worker
# (least-squares slopes over WORKERS). Configurations whose processes (with
# other programs') kept 80% of the cores busy are marked CPU-bound, and the
# model of docs/benchmarks.md ("Scaling: workers and shards") is checked
# against every round and projects it to dedicated hosts. A table on
# stdout, scaling.md, scaling.json and scaling.svg (round time against
# workers, measured solid, projected dashed); tests/bench/scaling_report.py
# computes the figures.
#
# The default sweep (36 configurations) should take about 21 minutes on the
# 2-core machine of tests/bench/results/README.md, estimated from its parts
# measured on 2026-11-27 with about 15% of the cores busy with other work:
# workers 1-8 at 80 steps in 5.1 min, 16 and 32 at 40 steps in 8.9 min, and
# each further step costs the two parts about 2 s and 6 s.
#
#   tests/bench/scaling.sh                  # results in a new /tmp/pserver-scaling.* folder
#   tests/bench/scaling.sh --results        # into tests/bench/results/
#   PARAMS=1000000 STEPS=20 DROP=4 WORKERS="1 4" SHARDS="1 2" tests/bench/scaling.sh   # ~30 s
#
# Rounds must outlast the poll that opens the window (20 ms): at 200,000
# parameters they do not, and the run stops saying so.
#
# Options: --results (write to tests/bench/results), --out DIR, --build DIR
# (default build/, as BUILD_DIR), --help. Variables (defaults):
#   PARAMS=4000000 TENSORS=8   the synthetic model
#   STEPS=100 DROP=8           steps per run and the first ones left out
#                              (connections, registration, 1-bit Adam's
#                              warmup and its first compressed round)
#   WORKERS="1 2 4 8 16 32" SHARDS="1 2 4" CODECS="fp32 onebit"
#   FREEZE_STEP=2              onebit: rounds of plain Adam before v freezes
#                              (DROP must exceed FREEZE_STEP + 1)
#   RUN_TIMEOUT=120+5*STEPS    seconds per configuration before it is
#                              stopped and the benchmark fails
#   PYTHON=/usr/bin/python3    for the report
# Every process it starts is stopped on every exit (also Ctrl-C or a failed
# run). Logs and each configuration's raw data (summary JSONs, /metrics
# pages and /proc samples at the window's ends) stay in a /tmp folder it
# names. Run it on a quiet machine (where other benchmarks take a lock,
# under it: `flock /tmp/pserver_bench.lock tests/bench/scaling.sh`); the
# report says how busy the cores were with other work during each window.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
OUT=""
die() { echo "scaling.sh: $*" >&2; exit 2; }
while (( $# )); do
  case "$1" in
    --results) OUT="$ROOT/tests/bench/results"; shift ;;
    --out) [[ -n "${2:-}" ]] || die "--out needs a folder"; OUT="$2"; shift 2 ;;
    --build) [[ -n "${2:-}" ]] || die "--build needs a folder"; BUILD="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'; expected --results, --out DIR, --build DIR or --help" ;;
  esac
done

PARAMS="${PARAMS:-4000000}"
TENSORS="${TENSORS:-8}"
STEPS="${STEPS:-100}"
DROP="${DROP:-8}"
WORKERS="${WORKERS:-1 2 4 8 16 32}"
SHARDS="${SHARDS:-1 2 4}"
CODECS="${CODECS:-fp32 onebit}"
FREEZE_STEP="${FREEZE_STEP:-2}"
RUN_TIMEOUT="${RUN_TIMEOUT:-$((120 + 5 * STEPS))}"
PYTHON="${PYTHON:-/usr/bin/python3}"
SERVER="$BUILD/server/pserver_server"
WORKER="$BUILD/worker/pserver_worker"

# Preconditions, one line each.
for v in PARAMS TENSORS STEPS DROP FREEZE_STEP RUN_TIMEOUT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v is '${!v}'; expected a positive integer"
done
for v in WORKERS SHARDS; do
  [[ "${!v}" =~ ^[[:space:]]*[1-9][0-9]*([[:space:]]+[1-9][0-9]*)*[[:space:]]*$ ]] ||
    die "$v is '${!v}'; expected positive integers separated by spaces"
done
(( TENSORS <= PARAMS )) || die "TENSORS is $TENSORS; expected at most PARAMS ($PARAMS)"
(( DROP < STEPS - 1 )) || die "DROP is $DROP; expected at most STEPS - 2 ($((STEPS - 2))) so that a window of rounds remains"
[[ -n "${CODECS// /}" ]] || die "CODECS is empty; expected fp32, onebit or both"
for c in $CODECS; do
  case "$c" in
    fp32) ;;
    onebit) (( DROP > FREEZE_STEP + 1 )) ||
              die "DROP is $DROP; onebit needs more than FREEZE_STEP + 1 ($((FREEZE_STEP + 1))) so its warmup stays out of the window" ;;
    *) die "CODECS has '$c'; expected fp32 or onebit" ;;
  esac
done
[[ -x "$SERVER" && -x "$WORKER" ]] ||
  die "no $SERVER or $WORKER; build them (cmake --build build --target pserver_server_bin pserver_worker_bin) or pass --build DIR"
[[ -x /usr/bin/time ]] || die "/usr/bin/time is missing (apt-get install time); it measures the workers' CPU"
[[ -x "$PYTHON" ]] || die "$PYTHON not found; the report needs it"
[[ -r /proc/self/stat && -r /proc/stat ]] || die "/proc is not readable; the CPU figures come from it"
for tool in pgrep grep; do command -v "$tool" >/dev/null || die "'$tool' not found (apt-get install procps grep)"; done
if pgrep -x pserver_server >/dev/null || pgrep -x pserver_worker >/dev/null; then
  echo "scaling.sh: other pserver daemons are running; their CPU use will show as other load" >&2
fi

DIR="$(mktemp -d /tmp/pserver-scaling.XXXXXX)"  # logs and raw data, kept
OUT="${OUT:-$DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

PIDS=()  # every process started and maybe still running: shards, /usr/bin/time, workers
# halt PID...: SIGTERM, up to 10 s to exit, then SIGKILL; reaps them.
halt() {
  local p t left
  (( $# )) || return 0
  kill -TERM "$@" 2>/dev/null || true
  for (( t = 0; t < 100; t++ )); do
    left=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && { left=1; break; }; done
    (( left )) || break
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}
on_exit() {
  local code=$?
  trap - EXIT INT TERM
  # With their children: a worker whose /usr/bin/time was recorded but not
  # yet the worker itself.
  local p kids=()
  for p in "${PIDS[@]}"; do kids+=($(pgrep -P "$p" || true)); done
  (( ${#PIDS[@]} )) && halt "${kids[@]}" "${PIDS[@]}"
  if (( code )); then
    echo "scaling.sh: failed; logs in $DIR, the last lines:" >&2
    for f in "$DIR"/*/*.log; do [[ -f "$f" ]] && { echo "== $f"; tail -3 "$f"; }; done >&2
  fi
  exit "$code"
}
trap on_exit EXIT
trap 'exit 130' INT TERM
fail() { echo "scaling.sh: $*" >&2; exit 1; }

# metrics PORT: a shard's /metrics page (bash's /dev/tcp, no client needed).
metrics() {
  local fd
  exec {fd}<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&"$fd"
  sed '1,/^\r\{0,1\}$/d' <&"$fd"
  exec {fd}<&-
}
# sample FILE ROLE:PID...: one line per process still running, "ROLE PID"
# and its /proc/PID/stat, then the machine's "cpu" line of /proc/stat and
# the time. Returns 1 if one of them has exited.
sample() {
  local file=$1 rp line gone=0
  shift
  : >"$file"
  for rp in "$@"; do
    if read -r line 2>/dev/null <"/proc/${rp#*:}/stat"; then
      echo "${rp%%:*} ${rp#*:} $line" >>"$file"
    else
      gone=1
    fi
  done
  echo "machine 0 $(head -1 /proc/stat)" >>"$file"
  echo "time 0 $EPOCHREALTIME" >>"$file"
  return "$gone"
}
alive() {  # alive PID...: true while any of them runs
  local p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

# run CODEC SHARDS WORKERS
run() {
  local codec=$1 ns=$2 nw=$3 rd="$DIR/$1_s$2_w$3" s w p deadline=$((SECONDS + RUN_TIMEOUT))
  local -a sflags wflags spids=() tpids=() wpids=() mports=() procs=()
  case "$codec" in
    fp32) sflags=(--optimizer=adam --pull_codec=fp32)
          wflags=(--push_codec=fp32 --warmup_codec=fp32) ;;
    onebit) sflags=(--optimizer=onebit_adam --freeze_step="$FREEZE_STEP" --pull_codec=onebit)
            wflags=(--push_codec=onebit --warmup_codec=bf16) ;;
  esac
  mkdir -p "$rd"
  printf 'codec=%s\nshards=%s\nworkers=%s\nserver_flags=%s\nworker_flags=%s\n' \
    "$codec" "$ns" "$nw" "${sflags[*]}" "${wflags[*]}" >"$rd/meta"
  for (( s = 0; s < ns; s++ )); do
    # A 600 s lease: a round of 32 workers on 2 cores must not drop anyone.
    "$SERVER" --shard_index=$s --num_shards="$ns" --num_workers="$nw" \
      --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --port_file="$rd/shard$s.port" \
      --drain_seconds=1 --lease_timeout_seconds=600 "${sflags[@]}" >"$rd/shard$s.log" 2>&1 &
    spids+=($!); PIDS+=($!)
  done
  local servers=""
  for (( s = 0; s < ns; s++ )); do
    while [[ ! -s "$rd/shard$s.port" ]] || ! grep -q 'metrics port [0-9]' "$rd/shard$s.log"; do
      alive "${spids[s]}" || fail "$codec $ns shards $nw workers: shard $s exited at start"
      (( SECONDS < deadline )) || fail "$codec $ns shards $nw workers: shard $s not listening"
      sleep 0.05
    done
    servers+="${servers:+,}127.0.0.1:$(<"$rd/shard$s.port")"
    mports+=("$(sed -n 's/.*(metrics port \([0-9]*\)).*/\1/p' "$rd/shard$s.log" | head -1)")
  done
  for (( w = 0; w < nw; w++ )); do
    /usr/bin/time -f '%e %U %S %M %R' -o "$rd/w$w.time" \
      "$WORKER" --servers="$servers" --worker_id=$w --num_workers="$nw" --model=synthetic \
      --synthetic_params="$PARAMS" --synthetic_tensors="$TENSORS" --steps="$STEPS" \
      --progress=lines --log_interval=1000 --rpc_timeout=600 --pull_timeout=900 \
      --metrics_listen= --summary_json="$rd/w$w.json" "${wflags[@]}" >"$rd/worker$w.log" 2>&1 &
    tpids+=($!); PIDS+=($!)
  done
  # The workers themselves, children of /usr/bin/time (sampled in /proc and
  # stopped directly: time does not pass SIGTERM on).
  for p in "${tpids[@]}"; do
    local child=""
    while [[ -z "$child" ]]; do
      child=$(pgrep -P "$p" || true)
      [[ -n "$child" ]] || { alive "$p" || fail "$codec $ns shards $nw workers: a worker exited at start"; sleep 0.01; }
    done
    wpids+=("$child"); PIDS+=("$child")
  done
  for (( s = 0; s < ns; s++ )); do procs+=("shard$s:${spids[s]}"); done
  for (( w = 0; w < nw; w++ )); do procs+=("w$w:${wpids[w]}"); done

  # The window opens when shard 0 has completed DROP rounds. Polling stops
  # then, so the scrapes cost the shard nothing inside the window.
  local step=0 page
  while (( step < DROP )); do
    alive "${wpids[@]}" || fail "$codec $ns shards $nw workers: the workers ended before round $DROP (see worker logs)"
    (( SECONDS < deadline )) || fail "$codec $ns shards $nw workers: round $DROP not reached in $RUN_TIMEOUT s (raise RUN_TIMEOUT)"
    sleep 0.02
    page=$(metrics "${mports[0]}" 2>/dev/null) || page=""
    [[ "$page" =~ pserver_server_step\{[^}]*\}\ ([0-9]+) ]] && step=${BASH_REMATCH[1]}
  done
  for (( s = 0; s < ns; s++ )); do
    metrics "${mports[s]}" >"$rd/shard$s.start.metrics" || fail "cannot read shard $s's /metrics"
  done
  sample "$rd/start.stat" "${procs[@]}" ||
    fail "$codec $ns shards $nw workers: a worker ended before the window opened (rounds too short to catch; raise STEPS or PARAMS)"
  # The window closes when the last worker has written its summary: its
  # training is over (exiting can take seconds more on a loaded machine).
  # The workers end by themselves; a failure or an overrun fails the sweep.
  # Workers that have exited by then are measured by /usr/bin/time.
  local closed=0
  while alive "${tpids[@]}" || (( ! closed )); do
    if (( ! closed )); then
      for (( w = 0; w < nw; w++ )); do [[ -e "$rd/w$w.json" ]] || break; done
      if (( w == nw )) || ! alive "${tpids[@]}"; then
        for p in "${spids[@]}"; do
          kill -0 "$p" 2>/dev/null || fail "$codec $ns shards $nw workers: a shard exited before the end"
        done
        sample "$rd/end.stat" "${procs[@]}" || true
        closed=1
        continue
      fi
    fi
    (( SECONDS < deadline )) || fail "$codec $ns shards $nw workers: still running after $RUN_TIMEOUT s (raise RUN_TIMEOUT)"
    sleep 0.02
  done
  for p in "${tpids[@]}"; do
    wait "$p" || fail "$codec $ns shards $nw workers: a worker failed (see $rd/worker*.log)"
  done
  for (( s = 0; s < ns; s++ )); do
    grep '^VmHWM' "/proc/${spids[s]}/status" | sed "s/^/shard$s /" >>"$rd/shard_rss"
    metrics "${mports[s]}" >"$rd/shard$s.end.metrics" || fail "cannot read shard $s's /metrics"
  done
  halt "${spids[@]}"
  PIDS=()
}

CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
CORES=$(nproc)
echo "scaling.sh: ${CPU_MODEL:-unknown CPU}, $CORES cores; $PARAMS parameters in $TENSORS tensors," \
  "$STEPS steps, window after round $DROP; workers $WORKERS; shards $SHARDS; codecs $CODECS" >&2
began=$SECONDS
for codec in $CODECS; do
  for ns in $SHARDS; do
    for nw in $WORKERS; do
      t0=$SECONDS
      run "$codec" "$ns" "$nw"
      echo "scaling.sh: $codec, $ns shards, $nw workers: $((SECONDS - t0)) s" >&2
    done
  done
done
echo "scaling.sh: all configurations in $((SECONDS - began)) s" >&2

"$PYTHON" "$ROOT/tests/bench/scaling_report.py" --runs_dir="$DIR" --out="$OUT" \
  --codecs="$CODECS" --shards="$SHARDS" --workers="$WORKERS" --params="$PARAMS" \
  --tensors="$TENSORS" --steps="$STEPS" --drop="$DROP" --freeze_step="$FREEZE_STEP" \
  --cores="$CORES" --cpu_model="${CPU_MODEL:-unknown}" --sweep_seconds=$((SECONDS - began)) \
  --commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "scaling.sh: wrote $OUT/scaling.md, scaling.json, scaling.svg (logs and raw data in $DIR)" >&2
