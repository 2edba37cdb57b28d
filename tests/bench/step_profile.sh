#!/usr/bin/env bash
# Where a step's CPU goes (issue 29 section 3): one shard and one worker on
# loopback training pserver_worker's synthetic model (PARAMS parameters,
# CODEC both ways, Adam on the shard) for STEPS steps; `perf record`
# (software clock sampling, so it works where hardware counters are not
# exposed) samples each process for RECORD seconds once SKIP seconds have
# passed (start-up, registration and the first step are over by then), and
# the top TOP symbols of each are printed with their share of the samples.
# Sampling slows the steps (about 1.5x here); read shares, not times.
#
#   tests/bench/step_profile.sh [BUILD_DIR]
#   PARAMS=100000000 CODEC=onebit STEPS=45 SKIP=22 RECORD=8 TOP=14 (defaults)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
PARAMS="${PARAMS:-100000000}" CODEC="${CODEC:-onebit}" STEPS="${STEPS:-45}"
SKIP="${SKIP:-22}" RECORD="${RECORD:-8}" TOP="${TOP:-14}"
command -v perf >/dev/null || { echo "step_profile.sh: perf not found (apt-get install linux-perf)" >&2; exit 2; }
for b in "$BUILD/server/pserver_server" "$BUILD/worker/pserver_worker"; do
  [[ -x "$b" ]] || { echo "step_profile.sh: no $b; build first" >&2; exit 2; }
done
DIR="$(mktemp -d /tmp/pserver-profile.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$DIR"' EXIT
"$BUILD/server/pserver_server" --num_workers=1 --optimizer=adam --pull_codec="$CODEC" \
  --listen=127.0.0.1:0 --metrics_listen= --port_file="$DIR/port" 2>"$DIR/server.log" &
server=$!
for _ in $(seq 600); do [[ -s "$DIR/port" ]] && break; sleep 0.05; done
[[ -s "$DIR/port" ]] || { cat "$DIR/server.log" >&2; exit 1; }
"$BUILD/worker/pserver_worker" --servers="127.0.0.1:$(cat "$DIR/port")" --model=synthetic \
  --synthetic_params="$PARAMS" --synthetic_tensors=8 --steps="$STEPS" --push_codec="$CODEC" \
  --warmup_codec="$CODEC" --progress=lines --log_interval=1000 --rpc_timeout=600 \
  --pull_timeout=600 --metrics_listen= --summary_json="$DIR/worker.json" >"$DIR/worker.log" 2>&1 &
worker=$!
sleep "$SKIP"
kill -0 "$worker" 2>/dev/null || { echo "step_profile.sh: the worker ended before SKIP=$SKIP s; raise STEPS" >&2; exit 1; }
perf record -F 499 -o "$DIR/worker.data" -p "$worker" -- sleep "$RECORD" 2>/dev/null &
sampler=$!
perf record -F 499 -o "$DIR/server.data" -p "$server" -- sleep "$RECORD" 2>/dev/null
wait "$sampler" || true
wait "$worker"
echo "$PARAMS parameters, $CODEC both ways; samples over $RECORD s after the first $SKIP s"
echo "machine: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) cores; malloc: $(sed -n 's/.*"malloc": "\([a-z]*\)".*/\1/p' "$DIR/worker.json")"
for who in worker server; do
  echo "== $who"
  perf report -i "$DIR/$who.data" --no-children --sort dso,symbol --stdio 2>/dev/null |
    grep -E '^ +[0-9.]+%' | sed -E 's/ +/ /g; s/ - - *$//' | cut -c1-140 | head -n "$TOP" || true
done
