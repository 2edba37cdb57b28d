#!/usr/bin/env bash
# Chaos benchmark (issue 30; needs root): a real job under a seeded random
# schedule of overlapping faults on every role, watched by a real Prometheus
# with deploy/prometheus/alerts.yml.
#
# The job: 2 shards and 4 workers, each a network namespace on one bridge
# (tests/bench/netns_lib.sh, every link tbf-shaped at 1 Gbit/s), training
# (--workload) the MLP on Fashion-MNIST with deploy/local.sh's recipe (1-bit
# Adam, 8-bit quantized warmup pushes to round 500, the workers' momentum
# decayed by 0.5 after it, 1-bit pushes and pulls; pserver_worker daemons),
# or the language model: python/examples/train_gpt.py --pserver (its small
# GPT, AdamW's groups, warmup + cosine schedule, clipping) with
# lm_fidelity.sh's ps_onebit recipe (1-bit Adam frozen at round 200, 8-bit
# both ways before, 1-bit after: deploy/schedules/q8_then_onebit.txtpb),
# each worker a Python process that resumes at the shards' step when
# restarted. Each daemon runs under a supervisor that
# restarts it on a failure exit, as Compose's `restart: on-failure` does:
# shards from their --checkpoint_dir (a small tmpfs each, checkpoints every
# CHECKPOINT_EVERY rounds), workers with their --state_file; a worker's exit
# 0 (training done) ends its supervisor. Prometheus (Debian's) scrapes every
# daemon each second from a namespace of its own on the bridge.
#
# For DURATION seconds after the first rounds, faults (chaos_report.py
# schedule: each class a few times, random targets, starts and lengths; never
# two on one daemon at once):
#   shard_kill         SIGKILL of a shard
#   worker_kill        SIGKILL of a worker
#   shard_worker_kill  SIGKILL of a shard and a worker at the same moment
#   worker_stop        SIGSTOP of a worker for longer than the lease, SIGCONT
#   shard_stop         SIGSTOP of a shard for 2-8 s, SIGCONT; the first of a
#                      full run 70-90 s (PserverShardDown's 1-minute for:)
#   link_down          a host's link down for 2-30 s (its eth0, or the hub's
#                      end of its veth), then up
#   throttle           a host's link at 10 Mbit/s both ways for 30 s
#   disk_full          a shard's checkpoint tmpfs filled by a file for
#                      20-60 s, then freed
#   ckpt_truncate      a shard SIGKILLed, its newest checkpoint file cut to
#                      half its length before the supervisor restarts it
# Every fault's start and end are logged (faults.log). Checked and reported:
# the job finishes (every worker's last run exits 0, the shards exit 0 on
# SIGTERM); every worker ends with one model (the SHA-256 of its final
# weights); the final quality (test accuracy; lm: the validation loss) is
# within the clean runs' spread over seeds (the same job without faults for
# seeds SEED.. SEED+CLEAN_RUNS-1; max - min) of the clean run of the same
# seed (with one clean run, within ACC_MARGIN of it); every checkpoint a shard
# wrote (each copied aside as it appears) loads: a throwaway shard started on
# it alone reports its step; no process is left running; per fault class, the
# faults injected, the time until training progressed again after the fault
# was lifted, the longest stall, the rounds lost (their updates thrown away
# by a shard's restart); each alert the class should raise fired in
# Prometheus and cleared; each speed alert that fired is borne out by the
# sampled counters (chaos_report.py says how each figure is computed). The
# results record the commit of a clean tree (a dirty one is refused unless
# ALLOW_DIRTY=1, or --short) and the machine (tests/bench/provenance.py).
# Results: PREFIX.md, PREFIX.json, PREFIX.svg (a timeline of the faults and
# the steps/s series); logs and raw data stay in a /tmp/pserver-chaos.*
# folder it names when a check fails or KEEP=1 (removed otherwise). Exit 0 when every check passes, 1 when one fails, 2 for a
# bad option or a missing tool, 77 when not root (skipped).
#
#   sudo tests/bench/chaos.sh                  # 10 min of faults, 3 clean runs: ~35 min
#   sudo tests/bench/chaos.sh --short          # 2 min of faults, 1 clean run: ~6 min
#   sudo tests/bench/chaos.sh --duration 6m --seed 7 --out /tmp/c/chaos
#   sudo tests/bench/chaos.sh --workload lm     # the language model
#
# Options:
#   --workload W       mlp (default) or lm; lm's results are
#                      tests/bench/results/chaos_lm.{md,json,svg} and its
#                      quality is rank 0's final validation loss (nats per
#                      byte; lower is better) instead of test accuracy
#   --duration T       the fault window: seconds, or Ns / Nm (default 10m; 2m short)
#   --short            the ctest mode: a 2-minute window, each class about
#                      once, a 10 s lease, 1 clean run; results under the work
#                      folder unless --out
#   --seed N           the schedule's and the job's seed (default 1)
#   --clean-runs N     clean runs, seeds SEED.. (default 3; 1 short; 0: no
#                      accuracy check)
#   --steps N          the job's length (default: calibrated, so that the job
#                      outlasts the window plus TAIL at the measured speed)
#   --out PREFIX       results PREFIX.{md,json,svg} (default
#                      tests/bench/results/chaos; short: WORK/chaos)
#   --build DIR        where pserver_server, pserver_worker and
#                      pserver_health_probe are (default build/, or BUILD=DIR;
#                      SERVER=, WORKER=, PROBE= name the binaries one by one).
#                      They are copied into the work folder first, so a
#                      rebuild during the run does not touch them.
#   --schedule FILE    run these faults instead of the seeded schedule (the
#                      format --print-schedule prints: id start_s seconds
#                      class targets detail; to reproduce one fault)
#   --print-schedule   print the fault schedule and exit
# Variables (defaults): LEASE=30 (10 short; the shards' --lease_timeout_seconds),
#   CHECKPOINT_EVERY=100, COMPUTE_DELAY_MS=40 (the chaos job's workers sleep
#   this long per step: it changes the timing only, the result is bit-identical,
#   and makes the clean runs, which run without it, shorter than the chaos
#   run), TAIL=120 (45 short; seconds of training planned after the window,
#   for recovery and for alerts to clear), ACC_MARGIN=0.01 (0.03 short; lm:
#   the loss, 0.03 and 0.06 short; used only with fewer than two clean runs),
#   RESTART_DELAY=1 (seconds before a supervisor restarts a daemon),
#   CALIBRATE=30 (seconds of the calibration run), RUN_TIMEOUT (seconds a job
#   may take: 3 x its planned time + 600), STUCK=300 (seconds without a new
#   shard step after which the chaos job counts as unable to recover: it is
#   stopped and reported as not finished), PYTHON=/usr/bin/python3.
# Traffic stays inside the namespaces; everything it creates (namespaces,
# tmpfs mounts, processes) is removed on every exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/bench"
PYTHON="${PYTHON:-/usr/bin/python3}"
BUILD="${BUILD:-${BUILD_DIR:-$ROOT/build}}"
DURATION=""
SHORT=0
SEED=1
CLEAN_RUNS=""
STEPS=0
OUT=""
PRINT_SCHEDULE=0
COMMAND="tests/bench/chaos.sh $*"
WORKLOAD=mlp
SCHEDULE=""
die() { echo "chaos.sh: $*" >&2; exit 2; }
skip() { echo "SKIP: chaos.sh: $*"; exit 77; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
seconds_of() {  # 600, 600s, 10m -> seconds
  [[ "$1" =~ ^([0-9]+)(s|m)?$ ]] || return 1
  if [[ "${BASH_REMATCH[2]}" == m ]]; then echo $((BASH_REMATCH[1] * 60)); else echo "${BASH_REMATCH[1]}"; fi
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration) need_value "$@"; DURATION=$(seconds_of "$2") || die "--duration is '$2'; expected seconds, Ns or Nm"; shift 2 ;;
    --short) SHORT=1; shift ;;
    --workload) need_value "$@"; WORKLOAD="$2"; shift 2
      [[ $WORKLOAD == mlp || $WORKLOAD == lm ]] || die "--workload is '$WORKLOAD'; expected mlp or lm" ;;
    --seed) need_value "$@"; SEED="$2"; shift 2 ;;
    --clean-runs) need_value "$@"; CLEAN_RUNS="$2"; shift 2 ;;
    --steps) need_value "$@"; STEPS="$2"; shift 2 ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --print-schedule) PRINT_SCHEDULE=1; shift ;;
    --schedule) need_value "$@"; SCHEDULE="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2
      [[ -f "$SCHEDULE" ]] || die "--schedule: no file $SCHEDULE" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
if [[ $SHORT == 1 ]]; then
  DURATION="${DURATION:-120}"; CLEAN_RUNS="${CLEAN_RUNS:-1}"
  LEASE="${LEASE:-10}"; TAIL="${TAIL:-45}"
  [[ $WORKLOAD == lm ]] && ACC_MARGIN="${ACC_MARGIN:-0.06}" || ACC_MARGIN="${ACC_MARGIN:-0.03}"
else
  DURATION="${DURATION:-600}"; CLEAN_RUNS="${CLEAN_RUNS:-3}"
  LEASE="${LEASE:-30}"; TAIL="${TAIL:-120}"
  [[ $WORKLOAD == lm ]] && ACC_MARGIN="${ACC_MARGIN:-0.03}" || ACC_MARGIN="${ACC_MARGIN:-0.01}"
fi
CHECKPOINT_EVERY="${CHECKPOINT_EVERY:-100}"
# The language model's steps are slow enough as they are.
[[ $WORKLOAD == lm ]] && COMPUTE_DELAY_MS=0
COMPUTE_DELAY_MS="${COMPUTE_DELAY_MS:-40}"
RESTART_DELAY="${RESTART_DELAY:-1}"
CALIBRATE="${CALIBRATE:-30}"
STUCK="${STUCK:-300}"
for v in SEED CLEAN_RUNS STEPS LEASE TAIL CHECKPOINT_EVERY COMPUTE_DELAY_MS CALIBRATE DURATION STUCK; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v is '${!v}'; expected an integer >= 0"
done
[[ "$RESTART_DELAY" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "RESTART_DELAY is '$RESTART_DELAY'; expected seconds"
[[ "$ACC_MARGIN" =~ ^[0-9]*\.?[0-9]+$ ]] || die "ACC_MARGIN is '$ACC_MARGIN'; expected a fraction like 0.01"
(( DURATION >= 60 )) || die "--duration is $DURATION s; expected at least 60 s"
(( LEASE >= 5 )) || die "LEASE is $LEASE; expected at least 5 seconds"
[[ -x "$PYTHON" ]] || die "$PYTHON not found; the schedule and the report need it"

schedule_args=(--seed "$SEED" --duration "$DURATION" --lease "$LEASE")
[[ $SHORT == 1 ]] && schedule_args+=(--short)
if [[ $PRINT_SCHEDULE == 1 ]]; then
  exec "$PYTHON" "$HERE/chaos_report.py" schedule "${schedule_args[@]}"
fi

[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, tc, tmpfs mounts)"
SERVER_SRC="${SERVER:-$BUILD/server/pserver_server}"
WORKER_SRC="${WORKER:-$BUILD/worker/pserver_worker}"
PROBE_SRC="${PROBE:-$BUILD/server/pserver_health_probe}"
for b in "$SERVER_SRC" "$WORKER_SRC" "$PROBE_SRC"; do
  [[ -x "$b" ]] || die "no $b; build it (cmake --build build --target pserver_server_bin pserver_worker_bin pserver_health_probe) or pass --build DIR"
done
if ! command -v prometheus >/dev/null || ! command -v curl >/dev/null; then
  # shellcheck source=../../deploy/packages.sh
  source "$ROOT/deploy/packages.sh"
  pserver_install_packages prometheus curl || die "prometheus and curl are needed (apt-get install prometheus curl)"
fi
for tool in prometheus promtool curl mount truncate; do
  command -v "$tool" >/dev/null || die "'$tool' not found"
done
if [[ $WORKLOAD == mlp ]]; then
  [[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
    die "no Fashion-MNIST in /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist)"
else
  ls "$BUILD"/python/pserver/_native*.so >/dev/null 2>&1 ||
    die "no Python extension in $BUILD/python/pserver: build first (tests/run.sh)"
  compgen -G "/usr/lib/python3.11/*.py" >/dev/null ||
    die "no .py files in /usr/lib/python3.11 (train_gpt.py's corpus)"
fi
promtool check rules "$ROOT/deploy/prometheus/alerts.yml" >/dev/null ||
  die "promtool rejects deploy/prometheus/alerts.yml"

# shellcheck source-path=SCRIPTDIR source=netns_lib.sh
source "$HERE/netns_lib.sh"
NETNS_PROG=chaos.sh
netns_check_tools

WORK="$(mktemp -d /tmp/pserver-chaos.XXXXXX)"
[[ $SHORT == 1 ]] && OUT="${OUT:-$WORK/chaos}"
[[ $WORKLOAD == lm ]] && OUT="${OUT:-$HERE/results/chaos_lm}"
OUT="${OUT:-$HERE/results/chaos}"
mkdir -p "$(dirname "$OUT")"
OUT="$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
NETNS_LOG_DIR="$WORK"
# The binaries, copied once: a relink of build/ mid-run cannot reach them.
mkdir -p "$WORK/bin"
cp "$SERVER_SRC" "$WORK/bin/pserver_server"
cp "$WORKER_SRC" "$WORK/bin/pserver_worker"
cp "$PROBE_SRC" "$WORK/bin/pserver_health_probe"
cp "$ROOT/deploy/prometheus/alerts.yml" "$WORK/alerts.yml"
if [[ $WORKLOAD == lm ]]; then
  # The package (with its extension) and the script, copied as the binaries.
  cp -r "$BUILD/python" "$WORK/python"
  mkdir -p "$WORK/examples"
  cp "$ROOT"/python/examples/*.py "$WORK/examples/"
  cp "$ROOT/deploy/schedules/q8_then_onebit.txtpb" "$WORK/schedule.txtpb"
fi
SERVER="$WORK/bin/pserver_server"
WORKER="$WORK/bin/pserver_worker"
PROBE="$WORK/bin/pserver_health_probe"
for b in "$SERVER" "$WORKER" "$PROBE"; do
  "$b" --help >/dev/null 2>&1 || die "$b (copied from $BUILD) does not run: is the build folder being rebuilt?"
done
echo "chaos.sh: work folder $WORK" >&2
# The commit and machine, before anything runs (refuses a dirty tree unless
# ALLOW_DIRTY=1; the short mode is a test, not a result, and allows it).
"$PYTHON" "$HERE/provenance.py" \
  $([[ ${ALLOW_DIRTY:-0} == 1 || $SHORT == 1 ]] && echo --allow-dirty) >"$WORK/provenance.json" ||
  die "provenance: see above"

MOUNTS=()          # tmpfs mounts to undo
BACKGROUND=()      # supervisors, injectors, the sampler and the archiver
RUN=""             # the current job's folder

# lift_all: every fault that may still be in force, undone (a job that ends
# inside the window, or an abort).
lift_all() {
  local h f
  for h in "${HOSTS[@]}"; do
    ip -n "$TAG-$h" link set eth0 up 2>/dev/null || true
    ip -n "$HUB" link set "$TAG$h" up 2>/dev/null || true
  done
  if [[ ${#HOSTS[@]} -gt 0 && -n "${BASE_BURST:-}" ]]; then
    netns_shape 1gbit "$BASE_BURST" 50ms 2>/dev/null || true
  fi
  if [[ -n "$RUN" ]]; then
    for f in "$RUN"/pids/*; do
      if [[ -f "$f" ]]; then kill -CONT "$(cat "$f")" 2>/dev/null || true; fi
    done
    rm -f "$RUN"/ckpt/*/chaos-fill "$RUN"/hold/* 2>/dev/null || true
  fi
  return 0
}

chaos_cleanup() {
  local code=$? pid m
  trap - EXIT INT TERM HUP
  set +e
  [[ -n "$RUN" ]] && touch "$RUN/stop" 2>/dev/null
  for pid in "${BACKGROUND[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  lift_all
  PIDS+=("${BACKGROUND[@]}")
  for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null || true; done
  (exit "$code")
  netns_cleanup
}

netns_start "chs$$"
trap chaos_cleanup EXIT
trap 'exit 129' HUP   # a closed terminal: clean up as for Ctrl-C
SHARD_IP=(198.18.3.10 198.18.3.11)
WORKER_IP=(198.18.3.20 198.18.3.21 198.18.3.22 198.18.3.23)
PROM_IP=198.18.3.2
for s in 0 1; do netns_host "s$s" "${SHARD_IP[$s]}"; done
for w in 0 1 2 3; do netns_host "w$w" "${WORKER_IP[$w]}"; done
netns_host pm "$PROM_IP"
ip netns add "$TAG-vf"; NAMESPACES+=("$TAG-vf")   # checkpoint loading, alone
ip -n "$TAG-vf" link set lo up
BASE_BURST=$(netns_default_burst "$(netns_rate_bps 1gbit)")
THROTTLE_BURST=$(netns_default_burst "$(netns_rate_bps 10mbit)")
netns_shape 1gbit "$BASE_BURST" 50ms
SERVERS="${SHARD_IP[0]}:50051,${SHARD_IP[1]}:50051"

now() { date +%s.%N | cut -c1-14; }
# event WHAT...: a supervisor's line in RUN/events.log (appends of one line
# are atomic).
event() { echo "$(now) $*" >>"$RUN/events.log"; }
fault_log() { echo "$(now) $*" >>"$RUN/faults.log"; }

# supervise NAME HOST BIN ARGS...: runs BIN in HOST's namespace and starts it
# again after RESTART_DELAY whenever it exits non-zero, until RUN/stop exists;
# exit 0 ends it. Each run logs to RUN/logs/NAME.N.log; the daemon's pid is
# in RUN/pids/NAME (ip execs it, so $! is the daemon). While RUN/hold/NAME
# exists, a restart waits (ckpt_truncate edits the folder first).
supervise() {
  local name=$1 host=$2 run=0 pid code
  shift 2
  trap - EXIT INT TERM
  while [[ ! -e "$RUN/stop" ]]; do
    ip netns exec "$TAG-$host" "$@" >"$RUN/logs/$name.$run.log" 2>&1 &
    pid=$!
    echo "$pid" >"$RUN/pids/$name"
    event "$name start $run $pid"
    code=0; wait "$pid" || code=$?
    event "$name exit $run $code"
    [[ $code -eq 0 || -e "$RUN/done" ]] && break
    while [[ -e "$RUN/hold/$name" && ! -e "$RUN/stop" ]]; do sleep 0.1; done
    sleep "$RESTART_DELAY"
    run=$((run + 1))
  done
}

if [[ $WORKLOAD == mlp ]]; then
  SERVER_FLAGS=(--num_shards=2 --num_workers=4 --optimizer=onebit_adam --lr=0.001
    --freeze_step=500 --onebit_momentum=worker --compression_beta1=0.5
    --pull_codec=onebit --pull_k_fraction=0.01)
else
  # tests/bench/lm_fidelity.py's ps_onebit (the learning rate comes from the
  # workers' schedule).
  SERVER_FLAGS=(--num_shards=2 --num_workers=4 --optimizer=onebit_adam
    --freeze_step=200 --bias_correction=true --beta1=0.9 --beta2=0.99
    --onebit_momentum=worker --compression_beta1=0.5 --pull_codec=onebit
    --schedule="$WORK/schedule.txtpb")
fi
# shard_flags S: shard S's flags in a job (RUN/ckpt/S is its checkpoint folder).
shard_flags() {
  echo --shard_index="$1" --listen="${SHARD_IP[$1]}:50051" --metrics_listen="${SHARD_IP[$1]}:9100" \
    "${SERVER_FLAGS[@]}" --checkpoint_dir="$RUN/ckpt/$1" --checkpoint_every="$CHECKPOINT_EVERY" \
    --lease_timeout_seconds="$LEASE"
}

# worker_command W SEED STEPS DELAY_MS: worker W's command line in WORKER_CMD
# (RUN/wW.json: its summary; with lm only rank 0 writes one; RUN/wW.weights
# (mlp) or RUN/wW.sha256 (lm): its final parameters, or their SHA-256).
worker_command() {
  local w=$1 seed=$2 steps=$3 delay=$4
  if [[ $WORKLOAD == mlp ]]; then
    WORKER_CMD=("$WORKER" --servers="$SERVERS" --worker_id="$w" --num_workers=4
      --steps="$steps" --batch_size=32 --seed="$seed" --push_codec=onebit
      --warmup_codec=quantize --k_fraction=0.01 --compute_delay_ms="$delay"
      --state_file="$RUN/state/w$w.state" --metrics_listen="${WORKER_IP[$w]}:9200"
      --progress=lines --log_interval=5 --summary_json="$RUN/w$w.json"
      --save_weights="$RUN/w$w.weights")
  else
    WORKER_CMD=(env PSERVER_SERVERS="$SERVERS" RANK="$w" WORLD_SIZE=4
      PYTHONPATH="$WORK/python" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
      "$PYTHON" "$WORK/examples/train_gpt.py" --pserver --size small
      --steps "$steps" --batch 16 --warmup 100 --lr 2e-3 --beta2 0.99
      --seed "$seed" --push-codec onebit
      --client-option "schedule=$WORK/schedule.txtpb"
      --client-option "metrics_listen=${WORKER_IP[$w]}:9200"
      --state-file "$RUN/state/w$w.state" --state-every 50 --log-every 50
      --json "$RUN/w$w.json" --weights-sha256 "$RUN/w$w.sha256")
  fi
}

# start_job NAME SEED STEPS DELAY_MS CHAOS: the cluster under supervisors and
# the sampler, and for the chaos run Prometheus and the checkpoint archiver;
# returns once the workers are started.
start_job() {
  local name=$1 seed=$2 steps=$3 delay=$4 prom=$5 s w ok
  RUN="$WORK/$name"
  mkdir -p "$RUN"/{logs,pids,hold,ckpt,archive,state}
  printf 'seed=%s\nsteps=%s\ncompute_delay_ms=%s\n' "$seed" "$steps" "$delay" >"$RUN/meta"
  for s in 0 1; do
    mkdir -p "$RUN/ckpt/$s" "$RUN/archive/$s"
    # About 8 checkpoints of this model (~1 MB each per shard): full only
    # when disk_full fills it.
    mount -t tmpfs -o size=8m tmpfs "$RUN/ckpt/$s"
    MOUNTS+=("$RUN/ckpt/$s")
  done
  if [[ $prom == 1 ]]; then
    sed -e "s|@SHARDS@|'${SHARD_IP[0]}:9100', '${SHARD_IP[1]}:9100'|" \
        -e "s|@WORKERS@|$(printf "'%s:9200', " "${WORKER_IP[@]}" | sed 's/, $//')|" \
        -e "s|@ALERTS@|$WORK/alerts.yml|" >"$RUN/prometheus.yml" <<'YAML'
# The Compose configuration (deploy/prometheus/prometheus.yml) at 1 s.
rule_files: ['@ALERTS@']
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: pserver-shard
    static_configs: [{targets: [@SHARDS@], labels: {role: shard}}]
  - job_name: pserver-worker
    static_configs: [{targets: [@WORKERS@], labels: {role: worker}}]
YAML
    promtool check config "$RUN/prometheus.yml" >/dev/null || fail "promtool rejects $RUN/prometheus.yml"
    ip netns exec "$TAG-pm" prometheus --config.file="$RUN/prometheus.yml" \
      --storage.tsdb.path="$RUN/tsdb" --web.listen-address=127.0.0.1:9090 \
      >"$RUN/logs/prometheus.log" 2>&1 &
    PROM_PID=$!; PIDS+=($!)
    ok=0
    for _ in $(seq 150); do
      ip netns exec "$TAG-pm" curl -sf http://127.0.0.1:9090/-/ready >/dev/null 2>&1 && { ok=1; break; }
      sleep 0.2
    done
    [[ $ok == 1 ]] || fail "Prometheus did not start (see $RUN/logs/prometheus.log)"
  fi
  for s in 0 1; do
    # shellcheck disable=SC2046
    supervise "shard$s" "s$s" "$SERVER" $(shard_flags "$s") 2>>"$RUN/supervisors.log" &
    SHARD_SUPERVISORS[$s]=$!
    BACKGROUND+=($!)
  done
  # Compose's gate: workers start once both shards serve health service "".
  for s in 0 1; do
    ok=0
    for _ in $(seq 300); do
      ip netns exec "$TAG-w0" "$PROBE" --address="${SHARD_IP[$s]}:50051" --timeout=1 >/dev/null 2>&1 && { ok=1; break; }
      sleep 0.1
    done
    [[ $ok == 1 ]] || fail "$name: shard $s never served its health service"
  done
  ip netns exec "$TAG-pm" "$PYTHON" "$HERE/chaos_report.py" sample --out "$RUN/samples.tsv" \
    --shards "${SHARD_IP[0]}:9100,${SHARD_IP[1]}:9100" \
    --workers "$(printf '%s:9200,' "${WORKER_IP[@]}" | sed 's/,$//')" --stop "$RUN/stop" &
  BACKGROUND+=($!)
  if [[ $prom == 1 ]]; then
    archiver &
    BACKGROUND+=($!)
  fi
  for w in 0 1 2 3; do
    worker_command "$w" "$seed" "$steps" "$delay"
    supervise "worker$w" "w$w" "${WORKER_CMD[@]}" 2>>"$RUN/supervisors.log" &
    WORKER_SUPERVISORS[$w]=$!
    BACKGROUND+=($!)
  done
  echo "$(now)" >"$RUN/started"
}

# archiver: copies every checkpoint file a shard renames into place (so
# complete) to RUN/archive/S before the shard deletes it (it keeps 2).
archiver() {
  trap - EXIT INT TERM
  local s f
  while :; do
    for s in 0 1; do
      for f in "$RUN/ckpt/$s"/ckpt-*.pserver; do
        [[ -f "$f" && ! -e "$RUN/archive/$s/${f##*/}" ]] || continue
        if cp "$f" "$RUN/archive/$s/.part" 2>/dev/null; then
          mv "$RUN/archive/$s/.part" "$RUN/archive/$s/${f##*/}" || true
        fi
      done
    done
    [[ -e "$RUN/stop" ]] && break
    sleep 0.3
  done
}

# shard_step S: shard S's pserver_server_step from its /metrics (empty when
# it does not answer within 1 s).
shard_step() {
  ip netns exec "$TAG-pm" curl -s --max-time 1 "http://${SHARD_IP[$1]}:9100/metrics" 2>/dev/null |
    awk '$1 ~ /^pserver_server_step([{]|$)/ {printf "%d", $2}' || true
}
# live_pid NAME: the daemon's pid if it runs (waits up to 10 s for a restart).
live_pid() {
  local pid
  for _ in $(seq 100); do
    pid=$(cat "$RUN/pids/$1" 2>/dev/null || true)
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && { echo "$pid"; return 0; }
    sleep 0.1
  done
  return 1
}
# target -> daemon name, host name
daemon_of() { case "$1" in s*) echo "shard${1#s}" ;; w*) echo "worker${1#w}" ;; esac; }

# inject ID CLASS TARGETS DURATION DETAIL: one fault, start to end.
inject() {
  local id=$1 class=$2 targets=$3 dur=$4 detail=$5 t pid pid2 step f size s h
  case "$class" in
    shard_kill|worker_kill)
      pid=$(live_pid "$(daemon_of "$targets")") || { fault_log "$id skip $class $targets not-running"; return; }
      step=""; [[ $targets == s* ]] && step=$(shard_step "${targets#s}")
      kill -9 "$pid"
      fault_log "$id start $class $targets pid=$pid step=${step:-?}"
      fault_log "$id end $class $targets" ;;
    shard_worker_kill)
      s=${targets%,*}; h=${targets#*,}
      pid=$(live_pid "$(daemon_of "$s")") || { fault_log "$id skip $class $targets not-running"; return; }
      pid2=$(live_pid "$(daemon_of "$h")") || { fault_log "$id skip $class $targets not-running"; return; }
      step=$(shard_step "${s#s}")
      kill -9 "$pid" "$pid2"
      fault_log "$id start $class $targets pid=$pid,$pid2 step=${step:-?}"
      fault_log "$id end $class $targets" ;;
    worker_stop|shard_stop)
      pid=$(live_pid "$(daemon_of "$targets")") || { fault_log "$id skip $class $targets not-running"; return; }
      step=""; [[ $targets == s* ]] && step=$(shard_step "${targets#s}")
      kill -STOP "$pid"
      fault_log "$id start $class $targets pid=$pid step=${step:-?}"
      sleep "$dur"
      kill -CONT "$pid" 2>/dev/null || true
      fault_log "$id end $class $targets" ;;
    link_down)
      # Logged first: under load, ip link can take seconds to return.
      fault_log "$id start $class $targets side=$detail"
      if [[ $detail == hub ]]; then
        ip -n "$HUB" link set "$TAG$targets" down
      else
        ip -n "$TAG-$targets" link set eth0 down
      fi
      sleep "$dur"
      if [[ $detail == hub ]]; then
        ip -n "$HUB" link set "$TAG$targets" up
      else
        ip -n "$TAG-$targets" link set eth0 up
      fi
      fault_log "$id end $class $targets" ;;
    throttle)
      fault_log "$id start $class $targets rate=10mbit"
      tc -n "$HUB" qdisc change dev "$TAG$targets" root tbf rate 10mbit burst "$THROTTLE_BURST" latency 50ms
      tc -n "$TAG-$targets" qdisc change dev eth0 root tbf rate 10mbit burst "$THROTTLE_BURST" latency 50ms
      sleep "$dur"
      tc -n "$HUB" qdisc change dev "$TAG$targets" root tbf rate 1gbit burst "$BASE_BURST" latency 50ms
      tc -n "$TAG-$targets" qdisc change dev eth0 root tbf rate 1gbit burst "$BASE_BURST" latency 50ms
      fault_log "$id end $class $targets" ;;
    disk_full)
      s=${targets%-disk}; f="$RUN/ckpt/${s#s}/chaos-fill"
      dd if=/dev/zero of="$f" bs=64k 2>/dev/null || true   # until ENOSPC
      fault_log "$id start $class $targets filled=$(stat -c %s "$f" 2>/dev/null || echo 0)"
      sleep "$dur"
      rm -f "$f"
      fault_log "$id end $class $targets" ;;
    ckpt_truncate)
      s=${targets#s}
      touch "$RUN/hold/shard$s"
      pid=$(live_pid "shard$s") || { rm -f "$RUN/hold/shard$s"; fault_log "$id skip $class $targets not-running"; return; }
      step=$(shard_step "$s")
      kill -9 "$pid"
      fault_log "$id start $class $targets pid=$pid step=${step:-?}"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      f=$(find "$RUN/ckpt/$s" -maxdepth 1 -name 'ckpt-*.pserver' | sort | tail -1)
      if [[ -n "$f" ]]; then
        # The archiver copies a checkpoint within 0.3 s of its writing; one
        # written just before the kill must be copied whole before it is cut
        # (the check is on checkpoints as the shard wrote them).
        for _ in $(seq 60); do [[ -e "$RUN/archive/$s/${f##*/}" ]] && break; sleep 0.05; done
        size=$(stat -c %s "$f")
        truncate -s $((size / 2)) "$f"
        detail="file=${f##*/} from=$size to=$((size / 2))"
      else
        detail="file=none"
      fi
      rm -f "$RUN/hold/shard$s"
      fault_log "$id end $class $targets $detail" ;;
  esac
}

# injector T0: runs RUN/schedule.tsv, each fault in a subshell of its own
# that sleeps until T0 + its start.
injector() {
  trap - EXIT INT TERM
  local t0=$1 id start dur class targets detail wait_s
  local -a subs=()
  while read -r id start dur class targets detail; do
    [[ "$id" == \#* || -z "$id" ]] && continue
    (
      wait_s=$(awk -v t0="$t0" -v s="$start" -v n="$(now)" 'BEGIN{d = t0 + s - n; printf "%.2f", (d > 0 ? d : 0)}')
      sleep "$wait_s"
      [[ -e "$RUN/stop" || -e "$RUN/done" ]] && { fault_log "$id skip $class $targets training-over"; exit 0; }
      inject "$id" "$class" "$targets" "$dur" "$detail"
    ) &
    subs+=($!)
  done <"$RUN/schedule.tsv"
  trap 'kill -TERM "${subs[@]}" 2>/dev/null; exit 0' TERM
  wait
}

# wait_workers LIMIT: every worker's supervisor ends (its worker exited 0).
# Returns 1, with the reason in RUN/unfinished, after LIMIT seconds or when
# no shard's step has moved for STUCK seconds (a job that cannot recover).
# Prints the job's progress every 30 s.
wait_workers() {
  local limit=$1 deadline=$((SECONDS + $1)) next=$((SECONDS + 30)) w alive
  local best=-1 moved=$SECONDS s0 s1 top
  while :; do
    alive=0
    for w in 0 1 2 3; do kill -0 "${WORKER_SUPERVISORS[$w]}" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    if (( SECONDS >= deadline )); then
      echo "workers still training after $limit s" >"$RUN/unfinished"
      return 1
    fi
    if (( SECONDS >= next )); then
      s0=$(shard_step 0); s1=$(shard_step 1)
      top=$(( ${s0:-0} > ${s1:-0} ? ${s0:-0} : ${s1:-0} ))
      if (( top > best )); then best=$top; moved=$SECONDS; fi
      echo "chaos.sh: $(basename "$RUN"): shard steps ${s0:--}/${s1:--}," \
        "$(grep -c ' start ' "$RUN/faults.log" 2>/dev/null || echo 0) faults so far" >&2
      if (( SECONDS - moved >= STUCK )); then
        echo "no shard step moved for $STUCK s (stuck at $best)" >"$RUN/unfinished"
        return 1
      fi
      next=$((SECONDS + 30))
    fi
    sleep 1
  done
  for w in 0 1 2 3; do wait "${WORKER_SUPERVISORS[$w]}" 2>/dev/null || true; done
}

# stop_job: SIGTERM to the shards (they drain, write a final checkpoint and
# exit 0), then the sampler, archiver and Prometheus; unmounts the tmpfs
# after a last copy of its checkpoints.
stop_job() {
  local s pid
  touch "$RUN/done"
  for s in 0 1; do
    pid=$(cat "$RUN/pids/shard$s" 2>/dev/null || true)
    [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null || true
  done
  for s in 0 1; do
    for _ in $(seq 300); do kill -0 "${SHARD_SUPERVISORS[$s]}" 2>/dev/null || break; sleep 0.1; done
  done
  touch "$RUN/stop"
  for pid in "${BACKGROUND[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  BACKGROUND=()
  for s in 0 1; do
    cp -n "$RUN/ckpt/$s"/ckpt-*.pserver "$RUN/archive/$s/" 2>/dev/null || true
    umount -l "$RUN/ckpt/$s" 2>/dev/null || true
  done
  MOUNTS=()
}

# stop_prometheus: after the report's queries.
stop_prometheus() {
  [[ -n "${PROM_PID:-}" ]] || return 0
  stop_pids "$PROM_PID"
  PROM_PID=""
}

# verify_checkpoints: each archived checkpoint alone in a folder, loaded by a
# throwaway shard in the "vf" namespace (no link); RUN/verify.tsv gets
# "shard file step_in_name restored_step_or_- first log line".
verify_checkpoints() {
  local s f d pid line n=0
  : >"$RUN/verify.tsv"
  for s in 0 1; do
    for f in "$RUN/archive/$s"/ckpt-*.pserver; do
      [[ -f "$f" ]] || continue
      d="$RUN/verify/$s-${f##*/}"
      mkdir -p "$d/ckpt"
      cp "$f" "$d/ckpt/"
      # shellcheck disable=SC2046
      ip netns exec "$TAG-vf" "$SERVER" $(shard_flags "$s" | sed "s|--checkpoint_dir=[^ ]*|--checkpoint_dir=$d/ckpt|; s|--listen=[^ ]*|--listen=127.0.0.1:0|; s|--metrics_listen=[^ ]*|--metrics_listen=127.0.0.1:0|") \
        --checkpoint_every=0 >"$d/log" 2>&1 &
      pid=$!
      for _ in $(seq 200); do grep -q "listening on port" "$d/log" 2>/dev/null && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
      line=$(grep -m1 -E "restored step|no usable checkpoint|refused checkpoint|pserver_server: " "$d/log" || echo "no output")
      printf '%s\t%s\t%s\t%s\t%s\n' "$s" "${f##*/}" "$(sed -n 's/^ckpt-0*\([0-9]\+\)\.pserver$/\1/p' <<<"${f##*/}")" \
        "$(sed -n 's/.*restored step \([0-9]*\).*/\1/p' <<<"$line")" "$line" >>"$RUN/verify.tsv"
      rm -rf "$d"
      n=$((n + 1))
    done
  done
  echo "chaos.sh: $(basename "$RUN"): loaded $n checkpoints one by one" >&2
  rm -rf "$RUN/archive"
}

# leftovers: our binaries still running anywhere, processes in our
# namespaces (RUN/leftovers.txt, empty when none).
leftovers() {
  local ns
  {
    pgrep -af "^$WORK/bin/" || true
    for ns in "${NAMESPACES[@]}"; do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do echo "$ns: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)"; done
    done
  } >"$RUN/leftovers.txt"
}

# run_job NAME SEED STEPS DELAY_MS CHAOS LIMIT: a job to its end, with the
# fault schedule when CHAOS is 1 (and Prometheus).
run_job() {
  local name=$1 seed=$2 steps=$3 delay=$4 chaos=$5 limit=$6 t0
  start_job "$name" "$seed" "$steps" "$delay" "$chaos"
  if [[ $chaos == 1 ]]; then
    if [[ -n "$SCHEDULE" ]]; then
      cp "$SCHEDULE" "$RUN/schedule.tsv"
    else
      "$PYTHON" "$HERE/chaos_report.py" schedule "${schedule_args[@]}" >"$RUN/schedule.tsv"
    fi
    # The window opens once every worker has pushed: the rounds are moving.
    for _ in $(seq 600); do
      step=$(shard_step 0); [[ -n "$step" && "$step" -ge 5 ]] && break
      sleep 0.2
    done
    t0=$(now)
    echo "$t0" >"$RUN/window_start"
    injector "$t0" &
    INJECTOR=$!
    BACKGROUND+=($!)
  fi
  local finished=1
  wait_workers "$limit" || finished=0
  echo "$(now)" >"$RUN/finished"
  touch "$RUN/done"
  if [[ $finished == 0 ]]; then
    echo "chaos.sh: $name did not finish: $(cat "$RUN/unfinished"); stopping it" >&2
    [[ $chaos == 1 ]] || fail "$name: a run without faults did not finish: $(cat "$RUN/unfinished")"
    touch "$RUN/stop"
    for w in 0 1 2 3; do kill -9 "$(cat "$RUN/pids/worker$w" 2>/dev/null)" 2>/dev/null || true; done
    for w in 0 1 2 3; do wait "${WORKER_SUPERVISORS[$w]}" 2>/dev/null || true; done
  fi
  if [[ $chaos == 1 ]]; then
    kill -TERM "$INJECTOR" 2>/dev/null || true
    wait "$INJECTOR" 2>/dev/null || true
  fi
  lift_all
  stop_job
}

cat >"$WORK/meta.json" <<JSON
{"command": "$COMMAND", "workload": "$WORKLOAD", "seed": $SEED, "duration": $DURATION, "short": $SHORT, "clean_runs": $CLEAN_RUNS,
 "lease_seconds": $LEASE, "checkpoint_every": $CHECKPOINT_EVERY,
 "compute_delay_ms": $COMPUTE_DELAY_MS, "tail": $TAIL, "acc_margin": $ACC_MARGIN,
 "restart_delay": $RESTART_DELAY, "schedule_file": "$SCHEDULE", "commit": "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)",
 "date": "$(date -u +%Y-%m-%dT%H:%MZ)", "load_start": "$(cut -d' ' -f1-3 /proc/loadavg)",
 "server_flags": "${SERVER_FLAGS[*]} --checkpoint_every=$CHECKPOINT_EVERY --lease_timeout_seconds=$LEASE"}
JSON

# Calibration: the chaos job's speed (with its compute delay), so that it
# outlasts the fault window plus TAIL.
if [[ "$STEPS" == 0 ]]; then
  start_job calibrate "$SEED" 1000000 "$COMPUTE_DELAY_MS" 0
  sleep "$CALIBRATE"
  touch "$RUN/stop"
  for w in 0 1 2 3; do kill -9 "$(cat "$RUN/pids/worker$w")" 2>/dev/null || true; done
  for w in 0 1 2 3; do wait "${WORKER_SUPERVISORS[$w]}" 2>/dev/null || true; done
  stop_job
  rate=$("$PYTHON" "$HERE/chaos_report.py" rate "$RUN/samples.tsv")
  STEPS=$(awk -v r="$rate" -v t=$((DURATION + TAIL)) 'BEGIN{printf "%d", int(r * t / 100 + 1) * 100}')
  echo "chaos.sh: calibration: $rate steps/s with the ${COMPUTE_DELAY_MS} ms delay; the job runs $STEPS steps" >&2
  (( STEPS >= 1000 )) || fail "calibration measured $rate steps/s: far too slow for a job (is the machine overloaded?)"
  rm -rf "$RUN"
fi
RUN_TIMEOUT="${RUN_TIMEOUT:-$((3 * (DURATION + TAIL) + 600))}"

for ((i = 0; i < CLEAN_RUNS; i++)); do
  echo "chaos.sh: clean run $((i + 1))/$CLEAN_RUNS, seed $((SEED + i)), $STEPS steps" >&2
  run_job "clean$i" $((SEED + i)) "$STEPS" 0 0 "$RUN_TIMEOUT"
  leftovers
  rm -rf "$RUN/archive"
done

echo "chaos.sh: the chaos run, seed $SEED, $STEPS steps, a ${DURATION} s fault window" >&2
run_job chaos "$SEED" "$STEPS" "$COMPUTE_DELAY_MS" 1 "$RUN_TIMEOUT"
# Alerts raised late in the window clear while Prometheus keeps evaluating;
# the shards are stopped, so their targets are down: the report reads the
# alerts up to the end of training.
ip netns exec "$TAG-pm" "$PYTHON" "$HERE/chaos_report.py" collect --prom http://127.0.0.1:9090 \
  --run "$RUN" >"$RUN/collect.log" 2>&1 || fail "reading Prometheus's API failed: $(tail -3 "$RUN/collect.log")"
stop_prometheus
leftovers
verify_checkpoints

code=0
"$PYTHON" "$HERE/chaos_report.py" report --work "$WORK" --out "$OUT" || code=$?
if [[ $code == 0 && "${KEEP:-0}" != 1 ]]; then
  rm -rf "$WORK"
else
  echo "chaos.sh: logs and raw data kept in $WORK" >&2
fi
exit "$code"
