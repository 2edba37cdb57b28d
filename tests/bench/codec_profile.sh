#!/usr/bin/env bash
# Codec profile on real gradients (issue 13): runs the reference workload
# (deploy/local.sh: Fashion-MNIST MLP, 2 shards, 4 workers x batch 32, the
# default 1-bit Adam recipe) with worker 0 capturing its raw minibatch
# gradients early, in the middle and late in training (pserver_worker
# --capture_gradients), then runs every codec of the sweep on them
# (codec_profile) and writes RESULTS/codec_profile.json, .md and .svg
# (codec_profile_report.py).
#
#   tests/bench/codec_profile.sh                      # capture and profile
#   GRADIENTS=FILE tests/bench/codec_profile.sh       # profile a saved capture
#   BUILD_DIR=/tmp/b tests/bench/codec_profile.sh     # build elsewhere
#
# Environment:
#   BUILD_DIR [ROOT/build]   where the binaries are built (-j JOBS, 1)
#   RESULTS [ROOT/tests/bench/results]   where the three files go
#   CAPTURE_STEPS [0-19,1000-1019,2200-2219]   windows of consecutive steps
#                 (5 epochs are 2344 steps; 1-bit Adam freezes at 600)
#   WINDOW_NAMES [early,middle,late]   one name per window
#   LOCAL_FLAGS   extra deploy/local.sh options (another recipe, --seed N)
#   BASE_PORT [53051] METRICS_PORT [9551] WORKER_METRICS_PORT [9651]
#                 must be free: gRPC binds with SO_REUSEPORT, so a second
#                 cluster on the same ports would silently share them (the
#                 script refuses to start if anything listens there;
#                 fidelity.sh uses 52051)
#   FILTER        only codecs whose label contains one of these (comma list)
#   REPETITIONS [5]   timed repetitions per codec and tensor
#   KEEP [0]      1: keep the capture and the run's logs (else removed)
#   SMOKE [0]     1: a fast check of the whole path (1 shard, 1 worker, a
#                 few steps, three codecs, results in a scratch folder),
#                 used by ctest (bench.codec_profile_smoke)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
JOBS="${JOBS:-1}"
CAPTURE_STEPS="${CAPTURE_STEPS:-0-19,1000-1019,2200-2219}"
WINDOW_NAMES="${WINDOW_NAMES:-early,middle,late}"
BASE_PORT="${BASE_PORT:-53051}"
METRICS_PORT="${METRICS_PORT:-9551}"
WORKER_METRICS_PORT="${WORKER_METRICS_PORT:-9651}"
REPETITIONS="${REPETITIONS:-5}"
FILTER="${FILTER:-}"
KEEP="${KEEP:-0}"
SMOKE="${SMOKE:-0}"
GRADIENTS="${GRADIENTS:-}"
LOCAL_FLAGS="${LOCAL_FLAGS:-}"
PY=/usr/bin/python3

die() { echo "codec_profile.sh: $*" >&2; exit 2; }
[[ "$CAPTURE_STEPS" =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] ||
  die "CAPTURE_STEPS is '$CAPTURE_STEPS'; expected ranges like 0-19,1000-1019"
[[ "$REPETITIONS" =~ ^[1-9][0-9]*$ ]] || die "REPETITIONS is '$REPETITIONS'; expected >= 1"

WORK="$(mktemp -d /tmp/pserver-codec-profile.XXXXXX)"
cleanup() { [[ "$KEEP" == 1 ]] || rm -rf "$WORK"; }
trap cleanup EXIT
local_opts=()
if [[ "$SMOKE" == 1 ]]; then
  CAPTURE_STEPS=0-2,8-9
  WINDOW_NAMES=early,late
  FILTER="${FILTER:-fp16,onebit b256 mean_abs,topk 1%}"
  REPETITIONS=1
  RESULTS="${RESULTS:-$WORK/results}"
  local_opts=(--shards 1 --workers 1)
  if [[ -z "$GRADIENTS" && ! -d /usr/share/datasets/fashion-mnist ]]; then
    echo "SKIP: no Fashion-MNIST (dataset-fashion-mnist)"; exit 77
  fi
fi
RESULTS="${RESULTS:-$ROOT/tests/bench/results}"

echo "codec_profile.sh: building in $BUILD_DIR"
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
if ! cmake --build "$BUILD_DIR" -j "$JOBS" --target codec_profile pserver_server_bin \
    pserver_worker_bin >"$WORK/build.log" 2>&1; then
  grep -E "error:|FAILED" "$WORK/build.log" | head -5 >&2
  die "build failed (KEEP=1 keeps $WORK/build.log)"
fi
PROFILE="$BUILD_DIR/tests/bench/codec_profile"
[[ -x "$PROFILE" ]] || die "build failed: no $PROFILE"

CAPTURED_FROM=""
if [[ -z "$GRADIENTS" ]]; then
  GRADIENTS="$WORK/gradients.bin"
  last="${CAPTURE_STEPS##*,}"
  last="${last##*-}"
  # Every port the run listens on, free before it starts (SO_REUSEPORT lets
  # a second server bind a port in use and take part of its connections).
  for p in $(seq "$BASE_PORT" $((BASE_PORT + 1))) \
           $(seq "$METRICS_PORT" $((METRICS_PORT + 1))) \
           $(seq "$WORKER_METRICS_PORT" $((WORKER_METRICS_PORT + 3))); do
    if ss -Htln "sport = :$p" | grep -q .; then
      die "port $p is in use (another cluster?); set BASE_PORT, METRICS_PORT, WORKER_METRICS_PORT"
    fi
  done
  echo "codec_profile.sh: capturing steps $CAPTURE_STEPS of worker 0 (logs in $WORK/run)"
  # The run stops after the last captured step; what comes later cannot
  # change the gradients before it.
  # shellcheck disable=SC2086
  if ! BUILD_DIR="$BUILD_DIR" BASE_PORT="$BASE_PORT" METRICS_PORT="$METRICS_PORT" \
      WORKER_METRICS_PORT="$WORKER_METRICS_PORT" RUN_DIR="$WORK/run" \
      WORKER0_FLAGS="--capture_gradients=$GRADIENTS --capture_steps=$CAPTURE_STEPS" \
      "$ROOT/deploy/local.sh" --steps $((last + 1)) "${local_opts[@]}" $LOCAL_FLAGS \
      >"$WORK/local.log" 2>&1; then
    tail -5 "$WORK/local.log" >&2
    die "the capture run failed (KEEP=1 keeps $WORK)"
  fi
  grep -E "test accuracy +[0-9]" "$WORK/local.log" || true
  # local.sh's own line naming shards, workers, optimizer and codecs.
  recipe="$(sed -n 's/^local.sh: \([0-9]* shards, .*\); logs in .*/\1/p' "$WORK/local.log" | head -1)"
  command="$(echo "deploy/local.sh --steps $((last + 1)) ${local_opts[*]} $LOCAL_FLAGS" | tr -s ' ')"
  CAPTURED_FROM="worker 0 of \`${command% }\` ($recipe; its other defaults) at steps $CAPTURE_STEPS"
fi
[[ -f "$GRADIENTS" ]] || die "GRADIENTS is '$GRADIENTS'; expected a gradient file"

mkdir -p "$RESULTS"
echo "codec_profile.sh: profiling $(du -h "$GRADIENTS" | cut -f1) of gradients"
"$PROFILE" --gradients="$GRADIENTS" --json="$RESULTS/codec_profile.json" \
  --window_names="$WINDOW_NAMES" --filter="$FILTER" --repetitions="$REPETITIONS"
load="$(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -n "$CAPTURED_FROM" ]]; then
  source_note="gradients from $CAPTURED_FROM"
else
  source_note="gradients from a saved capture, $GRADIENTS"
fi
"$PY" "$ROOT/tests/bench/codec_profile_report.py" --json "$RESULTS/codec_profile.json" \
  --out "$RESULTS" \
  --note "Made by tests/bench/codec_profile.sh on $(date -u +%Y-%m-%d) at commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown): $source_note; $(nproc) cores, load average $load when profiling. Throughput shares the machine with whatever else ran: compare codecs within a run, not across runs."
echo "codec_profile.sh: wrote $RESULTS/codec_profile.json, .md and .svg"
if [[ "$SMOKE" == 1 ]]; then
  # The whole path, checked on figures known without the data: fp16 halves
  # the bytes and errs by ~2^-11 relative; onebit with 256-element blocks
  # sends 1 bit + 32/256 bits per element; every tensor and the model have
  # a row per window and codec (the filter's "topk 1%" also picks the three
  # block_topk 1% rows); the table and the plot name every codec.
  "$PY" - "$RESULTS" <<'CHECK' || die "smoke check failed"
import json, sys
d = sys.argv[1]
j = json.load(open(d + "/codec_profile.json"))
rows = j["results"]
assert [w["name"] for w in j["windows"]] == ["early", "late"], j["windows"]
assert [w["steps"] for w in j["windows"]] == [3, 2], j["windows"]
assert len(rows) == 2 * 6 * (len(j["tensors"]) + 1), len(rows)
model = {(r["window"], r["label"]): r for r in rows if r["tensor"] == "(model)"}
for w in ("early", "late"):
    fp16, onebit = model[(w, "fp16")], model[(w, "onebit b256 mean_abs")]
    assert fp16["ratio"] == 2, fp16
    assert 1e-5 < fp16["rel_error"] < 1e-3, fp16
    assert abs(onebit["ratio"] - 32 / (1 + 32 / 256)) < 0.1, onebit
    assert 0 < onebit["ef_window_error"] < 2, onebit
md = open(d + "/codec_profile.md").read()
svg = open(d + "/codec_profile.svg").read()
for label in ("fp16", "onebit b256 mean_abs", "topk 1%", "block_topk 1% b16"):
    assert "| " + label + " |" in md, label
    assert label in svg, label
print("codec_profile.sh: smoke check passed")
CHECK
fi
