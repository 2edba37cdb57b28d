#!/usr/bin/env bash
# Large-model benchmark (not a unit test): one shard holding PARAMS fp32
# parameters (default 100M) and one worker with a synthetic model push and
# pull through real gRPC, well past gRPC's default 4 MiB message limit.
# Reports seconds per step and the peak resident memory of both processes
# against the model size, for the fp32 codec both ways and for 1-bit both
# ways.
#
#   tests/bench/large_model.sh [BUILD_DIR]        # PARAMS=100000000 STEPS=3
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
PARAMS="${PARAMS:-100000000}"
STEPS="${STEPS:-3}"
DIR="$(mktemp -d /tmp/pserver-large.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT

run() {  # run NAME PUSH PULL
  local name=$1 push=$2 pull=$3
  /usr/bin/time -f "%M" -o "$DIR/$name.server.rss" \
    "$BUILD/server/pserver_server" --num_workers=1 --optimizer=adam \
    --pull_codec="$pull" --listen=127.0.0.1:0 --metrics_listen= \
    --port_file="$DIR/$name.port" --max_message_mb=2047 2>"$DIR/$name.server.log" &
  local spid=$!
  for _ in $(seq 600); do [[ -s "$DIR/$name.port" ]] && break; sleep 0.05; done
  local start end
  start=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$DIR/$name.worker.rss" \
    "$BUILD/worker/pserver_worker" --servers="127.0.0.1:$(cat "$DIR/$name.port")" \
    --model=synthetic --synthetic_params="$PARAMS" --synthetic_tensors=8 \
    --steps="$STEPS" --push_codec="$push" --warmup_codec="$push" \
    --progress=lines --log_interval=1000 --rpc_timeout=600 --pull_timeout=600 \
    --summary_json="$DIR/$name.json" >"$DIR/$name.worker.log" 2>&1
  end=$(date +%s.%N)
  local p
  for p in $(pgrep -f "port_file=$DIR/$name.port"); do
    [[ "$(cat /proc/$p/comm 2>/dev/null)" == pserver_server ]] && kill -TERM "$p"
  done
  wait "$spid" 2>/dev/null || true
  local wall model_mb srss wrss
  wall=$(sed -n 's/.*"wall_seconds": \([0-9.]*\).*/\1/p' "$DIR/$name.json")
  model_mb=$(awk -v p="$PARAMS" 'BEGIN{printf "%.0f", p*4/1048576}')
  srss=$(( $(cat "$DIR/$name.server.rss") / 1024 ))
  wrss=$(( $(cat "$DIR/$name.worker.rss") / 1024 ))
  printf "%-8s %6d params/1e6  %6.2f s/step (incl. register %5.1f s total)  server peak %6d MiB (%.1fx model)  worker peak %6d MiB (%.1fx model)\n" \
    "$name" $((PARAMS / 1000000)) "$(awk -v w="$wall" -v s="$STEPS" 'BEGIN{print w/s}')" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" \
    "$srss" "$(awk -v r="$srss" -v m="$model_mb" 'BEGIN{print r/m}')" \
    "$wrss" "$(awk -v r="$wrss" -v m="$model_mb" 'BEGIN{print r/m}')"
}
echo "model: $PARAMS fp32 parameters = $(awk -v p="$PARAMS" 'BEGIN{printf "%.0f", p*4/1048576}') MiB, $STEPS steps, 1 shard, 1 worker"
run fp32 fp32 fp32
run onebit onebit onebit
