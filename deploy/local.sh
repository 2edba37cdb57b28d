#!/usr/bin/env bash
# The main command: a local pserver cluster training Fashion-MNIST.
#
# Installs what is missing (Debian bookworm), builds, starts the shards and
# workers on loopback, shows progress, prints a summary, and stops everything
# it started (also on Ctrl-C).
#
#   deploy/local.sh                         # 2 shards, 4 workers, 5 epochs, 1-bit Adam both ways
#   deploy/local.sh --epochs 1 --push-codec topk --pull-codec topk
#   WORKERS=2 SHARDS=1 deploy/local.sh
#
# Options (or the environment variable in brackets):
#   --shards N [SHARDS=2]          --workers N [WORKERS=4]
#   --epochs N [EPOCHS=5]          --steps N [STEPS=0: whole epochs]
#   --batch N [BATCH=32]           --lr X [LR=0.001]
#   --lr-warmup-rounds W [LR_WARMUP_ROUNDS=0]  the shards' learning rate rises
#                 linearly over the first W rounds: round t (from 0) takes
#                 lr * (t + 1) / W (0: no warmup)
#   --lr-decay D [LR_DECAY=constant]  after the warmup, constant, linear or
#                 cosine from --lr down to --min-lr over --lr-decay-rounds
#   --lr-decay-rounds N [LR_DECAY_ROUNDS=0; > 0 for linear and cosine]
#   --min-lr X [MIN_LR=0]  where the decay ends; the rate stays there after
#                 (pserver_server --lr_warmup_rounds, --lr_decay,
#                 --lr_decay_rounds, --min_lr; docs/architecture.md)
#   --optimizer NAME [OPTIMIZER=onebit_adam]   (onebit_adam, adam, sgd)
#   --push-codec C [PUSH_CODEC=onebit]         --pull-codec C [PULL_CODEC=onebit]
#   --warmup-codec C [WARMUP_CODEC=quantize: 8-bit, with error feedback]
#   --freeze-step N [FREEZE_STEP=500; 300 with --script]
#   --onebit-momentum M [ONEBIT_MOMENTUM=worker; with --script the shards'
#                 default, server]  where 1-bit Adam's compression stage
#                 takes its momentum (docs/architecture.md)
#   --compression-beta1 B [COMPRESSION_BETA1=0.5; with --script the shards'
#                 default, beta1]  the momentum's decay after the freeze
#                 (pserver_server --compression_beta1; -1: beta1, 0.9)
#   --k-fraction X [K_FRACTION=0.01]           --seed N [SEED=1]
#   --schedule FILE [SCHEDULE]  a compression schedule for shards and workers
#                 (docs/schedules.md; e.g. deploy/schedules/staged_quantize.json):
#                 its phases' codecs replace the codec options above
#   --base-port P [BASE_PORT=50051]  shards listen on P.., their metrics on
#                 METRICS_PORT=9100.., workers' metrics on 9200..
#   --run-dir D [RUN_DIR=a new folder under /tmp]   logs and summaries
#   --monitor     also start Prometheus (Debian's `prometheus`) scraping every
#                 daemon, and print the URL of a graph of the key series; when
#                 stdin is a terminal, Prometheus and the shards stay up after
#                 training until Ctrl-C. [PROMETHEUS_PORT=9090]
#   SERVER_FLAGS / WORKER_FLAGS: extra flags for every daemon (WORKER0_FLAGS: worker 0's).
#   --script FILE [ARGS...]  instead of pserver_worker, run a PyTorch script
#                 (e.g. python/examples/fashion_cnn.py) once per worker through
#                 `python3 -m pserver.launch` (docs/launch.md), with the shard
#                 options above; everything after FILE is the script's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARDS="${SHARDS:-2}"
WORKERS="${WORKERS:-4}"
EPOCHS="${EPOCHS:-5}"
STEPS="${STEPS:-0}"
BATCH="${BATCH:-32}"
LR="${LR:-0.001}"
LR_WARMUP_ROUNDS="${LR_WARMUP_ROUNDS:-0}"
LR_DECAY="${LR_DECAY:-constant}"
LR_DECAY_ROUNDS="${LR_DECAY_ROUNDS:-0}"
MIN_LR="${MIN_LR:-0}"
OPTIMIZER="${OPTIMIZER:-onebit_adam}"
PUSH_CODEC="${PUSH_CODEC:-onebit}"
PULL_CODEC="${PULL_CODEC:-onebit}"
WARMUP_CODEC="${WARMUP_CODEC:-quantize}"
FREEZE_STEP="${FREEZE_STEP:-}"
ONEBIT_MOMENTUM="${ONEBIT_MOMENTUM:-}"
COMPRESSION_BETA1="${COMPRESSION_BETA1:-}"
K_FRACTION="${K_FRACTION:-0.01}"
SEED="${SEED:-1}"
SCHEDULE="${SCHEDULE:-}"
BASE_PORT="${BASE_PORT:-50051}"
METRICS_PORT="${METRICS_PORT:-9100}"
WORKER_METRICS_PORT="${WORKER_METRICS_PORT:-9200}"
RUN_DIR="${RUN_DIR:-}"
MONITOR="${MONITOR:-0}"
PROMETHEUS_PORT="${PROMETHEUS_PORT:-9090}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
SCRIPT=""
SCRIPT_ARGS=()

die() { echo "local.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shards) need_value "$@"; SHARDS="$2"; shift 2 ;;
    --workers) need_value "$@"; WORKERS="$2"; shift 2 ;;
    --epochs) need_value "$@"; EPOCHS="$2"; shift 2 ;;
    --steps) need_value "$@"; STEPS="$2"; shift 2 ;;
    --batch) need_value "$@"; BATCH="$2"; shift 2 ;;
    --lr) need_value "$@"; LR="$2"; shift 2 ;;
    --lr-warmup-rounds) need_value "$@"; LR_WARMUP_ROUNDS="$2"; shift 2 ;;
    --lr-decay) need_value "$@"; LR_DECAY="$2"; shift 2 ;;
    --lr-decay-rounds) need_value "$@"; LR_DECAY_ROUNDS="$2"; shift 2 ;;
    --min-lr) need_value "$@"; MIN_LR="$2"; shift 2 ;;
    --optimizer) need_value "$@"; OPTIMIZER="$2"; shift 2 ;;
    --push-codec) need_value "$@"; PUSH_CODEC="$2"; shift 2 ;;
    --pull-codec) need_value "$@"; PULL_CODEC="$2"; shift 2 ;;
    --warmup-codec) need_value "$@"; WARMUP_CODEC="$2"; shift 2 ;;
    --freeze-step) need_value "$@"; FREEZE_STEP="$2"; shift 2 ;;
    --onebit-momentum) need_value "$@"; ONEBIT_MOMENTUM="$2"; shift 2 ;;
    --compression-beta1) need_value "$@"; COMPRESSION_BETA1="$2"; shift 2 ;;
    --k-fraction) need_value "$@"; K_FRACTION="$2"; shift 2 ;;
    --seed) need_value "$@"; SEED="$2"; shift 2 ;;
    --schedule) need_value "$@"; SCHEDULE="$2"; shift 2 ;;
    --base-port) need_value "$@"; BASE_PORT="$2"; shift 2 ;;
    --run-dir) need_value "$@"; RUN_DIR="$2"; shift 2 ;;
    --prometheus-port) need_value "$@"; PROMETHEUS_PORT="$2"; shift 2 ;;
    --monitor) MONITOR=1; shift ;;
    --script) need_value "$@"; SCRIPT="$2"; shift 2; SCRIPT_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo pipefail/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
for v in SHARDS WORKERS BATCH BASE_PORT PROMETHEUS_PORT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v is '${!v}'; expected a positive integer"
done
[[ "$EPOCHS" =~ ^[0-9]+$ && "$STEPS" =~ ^[0-9]+$ ]] || die "epochs/steps must be integers"
[[ "$LR_WARMUP_ROUNDS" =~ ^[0-9]+$ && "$LR_DECAY_ROUNDS" =~ ^[0-9]+$ ]] ||
  die "--lr-warmup-rounds/--lr-decay-rounds must be integers >= 0"
case "$LR_DECAY" in
  constant) ;;
  linear|cosine) [[ "$LR_DECAY_ROUNDS" -gt 0 ]] || die "--lr-decay $LR_DECAY needs --lr-decay-rounds > 0" ;;
  *) die "--lr-decay is '$LR_DECAY'; expected constant, linear or cosine" ;;
esac
# The reference workload's 1-bit recipe (tests/bench/fidelity.sh, issue 12);
# a --script run keeps the recipe its examples were measured with.
if [[ -n "$SCRIPT" ]]; then
  FREEZE_STEP="${FREEZE_STEP:-300}"
else
  FREEZE_STEP="${FREEZE_STEP:-500}"
  ONEBIT_MOMENTUM="${ONEBIT_MOMENTUM:-worker}"
  COMPRESSION_BETA1="${COMPRESSION_BETA1:-0.5}"
fi
momentum_flag=()
[[ -n "$ONEBIT_MOMENTUM" ]] && momentum_flag=(--onebit_momentum="$ONEBIT_MOMENTUM")
[[ -n "$COMPRESSION_BETA1" ]] && momentum_flag+=(--compression_beta1="$COMPRESSION_BETA1")
lr_flags=(--lr_warmup_rounds="$LR_WARMUP_ROUNDS" --lr_decay="$LR_DECAY"
  --lr_decay_rounds="$LR_DECAY_ROUNDS" --min_lr="$MIN_LR")
schedule_flag=()
if [[ -n "$SCHEDULE" ]]; then
  [[ -f "$SCHEDULE" ]] || die "--schedule: cannot read '$SCHEDULE'"
  schedule_flag=(--schedule="$(cd "$(dirname "$SCHEDULE")" && pwd)/$(basename "$SCHEDULE")")
fi

# shellcheck source=packages.sh
source "$ROOT/deploy/packages.sh"
packages=("${PSERVER_BUILD_PACKAGES[@]}" "${PSERVER_RUN_PACKAGES[@]}")
[[ "$MONITOR" == 1 ]] && packages+=(prometheus curl)
[[ -n "$SCRIPT" ]] && packages+=(python3-numpy python3-torch)
pserver_install_packages "${packages[@]}"

echo "local.sh: building in $BUILD_DIR"
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
elif [[ -n "$SCRIPT" ]]; then
  # A folder configured before pybind11-dev was installed, or with
  # PSERVER_BUILD_PYTHON=OFF, has no pserver_python target yet.
  cmake -S "$ROOT" -B "$BUILD_DIR" -DPSERVER_BUILD_PYTHON=ON >/dev/null
fi
cmake --build "$BUILD_DIR" --target pserver_server_bin pserver_worker_bin -- -j"$(nproc)" \
  | grep -E "error:|FAILED" || true
SERVER="$BUILD_DIR/server/pserver_server"
if [[ -n "$SCRIPT" ]]; then
  cmake --build "$BUILD_DIR" --target pserver_python -- -j"$(nproc)" \
    | grep -E "error:|FAILED" || true
  [[ -x "$SERVER" && -d "$BUILD_DIR/python/pserver" ]] || die "build failed"
  launch=(--shards "$SHARDS" --workers "$WORKERS" --server-bin "$SERVER"
    --optimizer "$OPTIMIZER" --lr "$LR" --freeze_step "$FREEZE_STEP"
    --pull_codec "$PULL_CODEC" --pull_k_fraction "$K_FRACTION"
    "${momentum_flag[@]}" "${lr_flags[@]}")
  [[ -n "$RUN_DIR" ]] && launch+=(--run-dir "$RUN_DIR")
  # shellcheck disable=SC2086
  PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}" exec /usr/bin/python3 \
    -m pserver.launch "${launch[@]}" ${SERVER_FLAGS:-} -- "$SCRIPT" "${SCRIPT_ARGS[@]}"
fi
WORKER="$BUILD_DIR/worker/pserver_worker"
[[ -x "$SERVER" && -x "$WORKER" ]] || die "build failed"

RUN_DIR="${RUN_DIR:-$(mktemp -d /tmp/pserver-run.XXXXXX)}"
mkdir -p "$RUN_DIR"
PIDS=()
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  exit "$code"
}
trap cleanup EXIT
trap 'echo; echo "local.sh: interrupted, stopping the cluster"; exit 130' INT TERM

addresses=()
for ((s = 0; s < SHARDS; s++)); do
  addresses+=("127.0.0.1:$((BASE_PORT + s))")
  # shellcheck disable=SC2086
  "$SERVER" --shard_index="$s" --num_shards="$SHARDS" --num_workers="$WORKERS" \
    --listen="127.0.0.1:$((BASE_PORT + s))" \
    --metrics_listen="127.0.0.1:$((METRICS_PORT + s))" \
    --optimizer="$OPTIMIZER" --lr="$LR" --freeze_step="$FREEZE_STEP" \
    --pull_codec="$PULL_CODEC" --pull_k_fraction="$K_FRACTION" \
    "${momentum_flag[@]}" "${lr_flags[@]}" "${schedule_flag[@]}" ${SERVER_FLAGS:-} \
    >"$RUN_DIR/shard$s.log" 2>&1 &
  PIDS+=($!)
done
servers="$(IFS=,; echo "${addresses[*]}")"

if [[ "$MONITOR" == 1 ]]; then
  targets=""
  for ((s = 0; s < SHARDS; s++)); do targets+="'127.0.0.1:$((METRICS_PORT + s))',"; done
  for ((w = 0; w < WORKERS; w++)); do targets+="'127.0.0.1:$((WORKER_METRICS_PORT + w))',"; done
  sed -e "s|targets: \[.*\] *# local.sh|targets: [${targets%,}]|" \
    "$ROOT/deploy/prometheus/local.yml" >"$RUN_DIR/prometheus.yml"
  cp "$ROOT/deploy/prometheus/alerts.yml" "$RUN_DIR/alerts.yml"  # its rule_files
  prometheus --config.file="$RUN_DIR/prometheus.yml" \
    --storage.tsdb.path="$RUN_DIR/prometheus-data" \
    --web.listen-address="127.0.0.1:$PROMETHEUS_PORT" >"$RUN_DIR/prometheus.log" 2>&1 &
  PROMETHEUS_PID=$!
  PIDS+=($!)
  ready=0
  for _ in $(seq 100); do
    if curl -sf "http://127.0.0.1:$PROMETHEUS_PORT/-/ready" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$PROMETHEUS_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ $ready != 1 ]]; then
    echo "local.sh: Prometheus did not start; its log ($RUN_DIR/prometheus.log) ends with:" >&2
    tail -3 "$RUN_DIR/prometheus.log" >&2
    exit 1
  fi
  # A graph page with the key series of the Grafana dashboard, last 15 min.
  urlencode() {
    local s="$1" out="" c i
    for ((i = 0; i < ${#s}; i++)); do
      c="${s:i:1}"
      case "$c" in [a-zA-Z0-9._~-]) out+="$c" ;; *) out+=$(printf '%%%02X' "'$c") ;; esac
    done
    echo "$out"
  }
  GRAPH_URL="http://127.0.0.1:$PROMETHEUS_PORT/graph?"
  g=0
  for expr in 'rate(pserver_server_step[1m])' \
              'pserver_worker_train_loss' \
              'pserver_worker_test_accuracy_ratio' \
              'sum by (codec) (rate(pserver_server_received_payload_bytes_total[1m]))' \
              'sum by (codec) (rate(pserver_server_sent_payload_bytes_total[1m]))' \
              'pserver_server_compression_ratio' \
              'histogram_quantile(0.9, sum by (le) (rate(pserver_server_round_duration_seconds_bucket[1m])))'; do
    GRAPH_URL+="g$g.expr=$(urlencode "$expr")&g$g.tab=0&g$g.range_input=15m&"
    g=$((g + 1))
  done
  GRAPH_URL="${GRAPH_URL%&}"
  echo "local.sh: Prometheus at http://127.0.0.1:$PROMETHEUS_PORT; key series: $GRAPH_URL"
fi

start=$(date +%s.%N)
echo "local.sh: $SHARDS shards, $WORKERS workers, optimizer $OPTIMIZER," \
  "push $PUSH_CODEC (warmup $WARMUP_CODEC), pull $PULL_CODEC${SCHEDULE:+, schedule $SCHEDULE};" \
  "logs in $RUN_DIR"
progress=lines
[[ -t 1 ]] && progress=bar
worker_pids=()
for ((w = 0; w < WORKERS; w++)); do
  args=(--servers="$servers" --worker_id="$w" --num_workers="$WORKERS"
        --epochs="$EPOCHS" --steps="$STEPS" --batch_size="$BATCH" --seed="$SEED"
        --push_codec="$PUSH_CODEC" --warmup_codec="$WARMUP_CODEC"
        --k_fraction="$K_FRACTION" "${schedule_flag[@]}"
        --metrics_listen="127.0.0.1:$((WORKER_METRICS_PORT + w))"
        --summary_json="$RUN_DIR/worker$w.json")
  if [[ $w -eq 0 ]]; then
    # Worker 0 shows its progress here; the others log to files.
    # shellcheck disable=SC2086
    "$WORKER" "${args[@]}" --progress="$progress" ${WORKER_FLAGS:-} ${WORKER0_FLAGS:-} \
      > >(tee "$RUN_DIR/worker$w.log") 2>&1 &
  else
    # shellcheck disable=SC2086
    "$WORKER" "${args[@]}" --progress=lines ${WORKER_FLAGS:-} \
      >"$RUN_DIR/worker$w.log" 2>&1 &
  fi
  worker_pids+=($!)
  PIDS+=($!)
done

failed=0
for ((w = 0; w < WORKERS; w++)); do
  if ! wait "${worker_pids[$w]}"; then
    echo "local.sh: worker $w failed; its log ($RUN_DIR/worker$w.log) ends with:" >&2
    tail -3 "$RUN_DIR/worker$w.log" >&2
    failed=1
  fi
done
end=$(date +%s.%N)
[[ $failed -eq 0 ]] || exit 1

# The summary, from the workers' JSON files (no tools beyond awk needed).
field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1"; }
up=0; down=0; up32=0; down32=0
for ((w = 0; w < WORKERS; w++)); do
  f="$RUN_DIR/worker$w.json"
  up=$(awk -v a="$up" -v b="$(field "$f" push_bytes)" 'BEGIN{printf "%.0f", a+b}')
  down=$(awk -v a="$down" -v b="$(field "$f" pull_bytes)" 'BEGIN{printf "%.0f", a+b}')
  up32=$(awk -v a="$up32" -v b="$(field "$f" push_fp32_bytes)" 'BEGIN{printf "%.0f", a+b}')
  down32=$(awk -v a="$down32" -v b="$(field "$f" pull_fp32_bytes)" 'BEGIN{printf "%.0f", a+b}')
done
acc=$(field "$RUN_DIR/worker0.json" test_accuracy)
steps=$(field "$RUN_DIR/worker0.json" steps)
awk -v acc="$acc" -v up="$up" -v down="$down" -v up32="$up32" -v down32="$down32" \
    -v t="$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" -v steps="$steps" \
    -v w="$WORKERS" 'BEGIN {
  printf "\n== pserver local run ==\n"
  printf "test accuracy      %.2f%% after %d steps\n", acc * 100, steps
  printf "bytes up (push)    %.1f MB  (fp32 would send %.1f MB: %.1fx less)\n", up/1e6, up32/1e6, up32/up
  printf "bytes down (pull)  %.1f MB  (fp32 would send %.1f MB: %.1fx less)\n", down/1e6, down32/1e6, down32/down
  printf "total              %.1fx less than fp32 (%.1f MB per worker)\n", (up32+down32)/(up+down), (up+down)/w/1e6
  printf "wall time          %.1f s\n", t
}'
echo "metrics            shards: http://127.0.0.1:$METRICS_PORT/metrics .. :$((METRICS_PORT + SHARDS - 1)); workers: http://127.0.0.1:$WORKER_METRICS_PORT/metrics .. :$((WORKER_METRICS_PORT + WORKERS - 1)) (while running)"
if [[ "$MONITOR" == 1 ]]; then
  echo "prometheus         $GRAPH_URL"
fi
echo "logs               $RUN_DIR"
if [[ "$MONITOR" == 1 && -t 0 ]]; then
  echo "local.sh: Prometheus and the shards stay up for you to look; Ctrl-C stops them."
  wait "$PROMETHEUS_PID" || true
fi
