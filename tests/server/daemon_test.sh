#!/bin/bash
# The pserver_server daemon from the outside: --help, invalid flag
# combinations (non-zero exit, one line naming the flag), and a clean exit 0
# on SIGTERM and on SIGINT when started on port 0. A live /metrics scrape of
# the daemon goes through `promtool check metrics` when promtool is installed.
# With a worker binary: --max_model_elements reaches the shard (a model one
# element above it is refused at Register, one at it trains).
#
#   daemon_test.sh /path/to/pserver_server [/path/to/pserver_worker]
set -u

BIN=${1:?usage: daemon_test.sh /path/to/pserver_server [/path/to/pserver_worker]}
WORKER=${2:-}
WORK=$(mktemp -d /tmp/pserver_daemon_test.XXXXXX)
PIDS=()
FAILED=0

cleanup() {
  for pid in "${PIDS[@]}"; do
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  FAILED=1
}

# shellcheck source=../test_util/cli_checks.sh
CLI_CHECKS_NO_SETUP=1 source "$(dirname "${BASH_SOURCE[0]}")/../test_util/cli_checks.sh"

# --- --help ---------------------------------------------------------------
check_help "$BIN" listen metrics_listen shard_index num_shards num_workers \
  optimizer lr beta1 beta2 eps weight_decay freeze_step variance_floor \
  onebit_mode onebit_momentum pull_codec schedule max_message_mb grpc_memory_mb max_model_elements \
  drain_seconds tls_cert tls_key tls_ca auth_token_file

# --- invalid combinations ---------------------------------------------------
# Each: the flag its one-line error must name, then the arguments; every one
# exits 2 at once (cli_checks.sh's check_invalid).
check_invalid() {
  local flag=$1
  shift
  check_invalid_exit 2 "$BIN" "$flag" "" --listen=127.0.0.1:0 \
    --metrics_listen=127.0.0.1:0 "$@"
}
check_invalid --shard_index --shard_index=2 --num_shards=2
check_invalid --num_shards --num_shards=0
check_invalid --optimizer --optimizer=lamb
check_invalid --pull_codec --pull_codec=zip
# Compression schedules: a missing file, one that does not parse, a phase
# out of range, fp32 pulls mixed with compressed ones.
printf '{"phases": [{"push": {"codec": "quantize", "params": {"bits": 9}}}]}' \
  >"$WORK/bits.json"
printf '{"phases": [{"pull": {"codec": "fp32"}}]}' >"$WORK/fp32.json"
printf 'phases { bgin_step: 3 }' >"$WORK/typo.txt"
check_invalid_exit 2 "$BIN" --schedule "cannot read" --listen=127.0.0.1:0 \
  --metrics_listen=127.0.0.1:0 --schedule="$WORK/none.json"
check_invalid_exit 2 "$BIN" --schedule "phase 0 push: params.bits is 9; expected 2..8" \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --schedule="$WORK/bits.json"
check_invalid_exit 2 "$BIN" --schedule "text format" --listen=127.0.0.1:0 \
  --metrics_listen=127.0.0.1:0 --schedule="$WORK/typo.txt"
check_invalid_exit 2 "$BIN" --schedule "pulls with fp32 but --pull_codec is onebit" \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --schedule="$WORK/fp32.json"
check_invalid --num_workers --num_workers=0
check_invalid --onebit_mode --onebit_mode=fast
check_invalid --onebit_momentum --onebit_momentum=both
check_invalid --max_message_mb --max_message_mb=0
check_invalid --grpc_memory_mb --grpc_memory_mb=16 --max_message_mb=64
check_invalid --max_model_elements --max_model_elements=0
check_invalid --max_model_elements --max_model_elements=536870913
check_invalid --metrics_listen --metrics_listen=bogus
check_invalid --tls_key --tls_cert=/nonexistent.pem
check_invalid --lr --lr=-1
check_invalid --beta1 --beta1=1.5

# --- start on port 0, stop with a signal -------------------------------------
# Starts the daemon, waits until it listens, sets PID, GRPC_PORT, METRICS_PORT.
start_daemon() {
  local log=$1
  : >"$log"  # exists before the background shell opens it
  shift
  "$BIN" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --num_workers=2 \
    "$@" 2>"$log" &
  PID=$!
  PIDS+=("$PID")
  for _ in $(seq 1 100); do
    if grep -q 'listening on port' "$log"; then break; fi
    if ! kill -0 "$PID" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if ! grep -q 'listening on port' "$log"; then
    fail "daemon did not start: $(cat "$log")"
    return 1
  fi
  GRPC_PORT=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$log")
  METRICS_PORT=$(sed -n 's/.*(metrics port \([0-9]*\)).*/\1/p' "$log")
  [ -n "$GRPC_PORT" ] && [ "$GRPC_PORT" -gt 0 ] || fail "no gRPC port in: $(cat "$log")"
  [ -n "$METRICS_PORT" ] && [ "$METRICS_PORT" -gt 0 ] || fail "no metrics port in: $(cat "$log")"
  return 0
}

# Waits up to 10 s for PID to exit; sets RC (or fails and kills it).
wait_exit() {
  for _ in $(seq 1 100); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$PID" 2>/dev/null; then
    fail "daemon still running 10 s after $1"
    kill -KILL "$PID" 2>/dev/null
  fi
  wait "$PID"
  RC=$?
}

for sig in TERM INT; do
  if start_daemon "$WORK/daemon_$sig.log"; then
    if [ "$sig" = TERM ]; then
      # While it runs: /metrics answers, and promtool accepts it.
      if exec 3<>"/dev/tcp/127.0.0.1/$METRICS_PORT"; then
        printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
        timeout 10 cat <&3 >"$WORK/scrape.http"
        exec 3<&-
        head -1 "$WORK/scrape.http" | grep -q ' 200 ' ||
          fail "GET /metrics: $(head -1 "$WORK/scrape.http")"
        sed '1,/^\r$/d' "$WORK/scrape.http" >"$WORK/scrape.txt"
        grep -q '^pserver_build_info{' "$WORK/scrape.txt" ||
          fail "/metrics has no pserver_build_info"
        # The allocator the build chose is the one the daemon runs on (a
        # linker that drops the unreferenced tcmalloc would leave glibc's).
        cache="$(dirname "$BIN")/../CMakeCache.txt"
        if grep -qx 'PSERVER_MALLOC:STRING=tcmalloc' "$cache" 2>/dev/null &&
           ! grep -q '^CMAKE_CXX_FLAGS:STRING=.*-fsanitize' "$cache"; then
          grep -q '^pserver_build_info{.*malloc="tcmalloc"' "$WORK/scrape.txt" ||
            fail "built with PSERVER_MALLOC=tcmalloc, but /metrics says: $(grep '^pserver_build_info' "$WORK/scrape.txt")"
        fi
        grep -q '^pserver_server_step{shard="0"} 0' "$WORK/scrape.txt" ||
          fail "/metrics has no pserver_server_step"
        if command -v promtool >/dev/null; then
          out=$(promtool check metrics <"$WORK/scrape.txt" 2>&1) ||
            fail "promtool check metrics failed: $out"
          [ -z "$out" ] || fail "promtool check metrics reported: $out"
        else
          echo "note: promtool not installed; /metrics lint skipped" >&2
        fi
      else
        fail "cannot connect to the metrics port $METRICS_PORT"
      fi
    fi
    kill -"$sig" "$PID"
    wait_exit "SIG$sig"
    [ "$RC" -eq 0 ] || fail "daemon exited $RC after SIG$sig, expected 0: $(cat "$WORK/daemon_$sig.log")"
    grep -q 'stopped' "$WORK/daemon_$sig.log" ||
      fail "no 'stopped' line after SIG$sig: $(cat "$WORK/daemon_$sig.log")"
  fi
done

# --- --max_model_elements reaches the shard ----------------------------------
# A synthetic model of 2000 elements against caps of 1999 and 2000.
if [ -n "$WORKER" ]; then
  for cap in 1999 2000; do
    if start_daemon "$WORK/cap_$cap.log" --num_workers=1 --max_model_elements=$cap; then
      timeout 60 "$WORKER" --servers=127.0.0.1:$GRPC_PORT --model=synthetic \
        --synthetic_params=2000 --synthetic_tensors=2 --steps=2 \
        --progress=lines --rpc_timeout=5 --retry_budget=5 \
        >"$WORK/worker_$cap.out" 2>"$WORK/worker_$cap.err"
      rc=$?
      if [ "$cap" -eq 1999 ]; then
        [ "$rc" -ne 0 ] || fail "a 2000-element model trained under --max_model_elements=1999"
        grep -q 'layout holds 2000 elements; this shard accepts at most 1999 (--max_model_elements)' \
          "$WORK/worker_$cap.err" ||
          fail "no --max_model_elements refusal: $(cat "$WORK/worker_$cap.err")"
      else
        [ "$rc" -eq 0 ] ||
          fail "a 2000-element model was refused under --max_model_elements=2000 (exit $rc): $(cat "$WORK/worker_$cap.err")"
      fi
      kill -TERM "$PID"
      wait_exit "SIGTERM"
    fi
  done
fi

if [ "$FAILED" -ne 0 ]; then
  echo "daemon_test: FAILED" >&2
  exit 1
fi
echo "daemon_test: passed"
