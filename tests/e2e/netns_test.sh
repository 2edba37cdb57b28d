#!/usr/bin/env bash
# Multi-host end to end in network namespaces: one namespace per shard, per
# worker and for Prometheus, each with a veth pair onto a bridge in a hub
# namespace, addresses from the benchmarking range 198.18.0.0/15. The real
# daemons run inside with the flags of deploy/docker-compose.yml (2 shards, 4
# workers, 1-bit Adam, 1-bit pushes and pulls); workers start only once
# pserver_health_probe sees both shards SERVING across the bridge. A real
# Prometheus (Debian's) scrapes them all; its HTTP API must show every daemon
# `up` and data for every query of the Grafana dashboard. Traffic stays inside
# these namespaces. Everything is removed on any exit.
#
#   tests/e2e/netns_test.sh SERVER_BIN WORKER_BIN PROBE_BIN
# Base for bandwidth-limited runs: `tc qdisc add dev <veth> root tbf ...` on
# the hub side of a host's veth (netem is not available here).
set -euo pipefail
SERVER="$1"; WORKER="$2"; PROBE="$3"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STEPS="${STEPS:-4000}"  # ~20 s of training on a quiet machine: it must outlast the query time
DASHBOARD="$ROOT/deploy/grafana/dashboards/pserver.json"

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for ip netns"
# Packages tests/run.sh installs: missing, they are a failure, not a skip.
missing() { echo "FAIL: $* is not installed; tests/run.sh installs it"; exit 1; }
command -v ip >/dev/null || missing "ip (iproute2)"
command -v prometheus >/dev/null || missing "prometheus (apt-get install prometheus)"
command -v curl >/dev/null || missing curl
command -v python3 >/dev/null || missing python3

TAG="ps$$"                     # names: namespaces, veths (<= 15 characters)
HUB="$TAG-hub"
DIR="$(mktemp -d /tmp/pserver-netns.XXXXXX)"
NAMESPACES=()
PIDS=()
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 30); do
    alive=0; for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break; sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  # Anything else still running in our namespaces was started by this test.
  for ns in "${NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  wait 2>/dev/null || true
  # Deleting a namespace deletes the veth ends in it, and so their peers.
  for ns in "${NAMESPACES[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
  if [[ $code -ne 0 ]]; then
    for f in "$DIR"/*.log; do [[ -f "$f" ]] && { echo "== $f"; tail -5 "$f"; }; done >&2
  fi
  rm -rf "$DIR"
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

ip netns add "$HUB" 2>/dev/null || skip "ip netns add failed (no permission for network namespaces here)"
NAMESPACES+=("$HUB")
ip -n "$HUB" link set lo up
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up

# host NAME INDEX ADDRESS: a namespace on the bridge.
host() {
  local ns="$TAG-$1" addr="$2"
  ip netns add "$ns"; NAMESPACES+=("$ns")
  ip -n "$ns" link set lo up
  ip link add "$TAG$1" netns "$HUB" type veth peer name eth0 netns "$ns"
  ip -n "$HUB" link set "$TAG$1" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
}
SHARD_IP=(198.18.0.10 198.18.0.11)
WORKER_IP=(198.18.0.20 198.18.0.21 198.18.0.22 198.18.0.23)
PROM_IP=198.18.0.2
for s in 0 1; do host "s$s" "${SHARD_IP[$s]}"; done
for w in 0 1 2 3; do host "w$w" "${WORKER_IP[$w]}"; done
host prom "$PROM_IP"
# Daemons start as `ip netns exec NS BIN ... &` (not through this function),
# so that $! is the daemon itself: ip execs it.
in_ns() { local ns="$TAG-$1"; shift; ip netns exec "$ns" "$@"; }

start=$(date +%s)
for s in 0 1; do
  ip netns exec "$TAG-s$s" "$SERVER" --shard_index=$s --num_shards=2 --num_workers=4 \
    --listen="${SHARD_IP[$s]}:50051" --metrics_listen="${SHARD_IP[$s]}:9100" \
    --optimizer=onebit_adam --lr=0.001 --freeze_step=100 --pull_codec=onebit \
    --pull_k_fraction=0.01 --drain_seconds=2 --checkpoint_dir="$DIR/ckpt$s" \
    --checkpoint_every=100 >"$DIR/shard$s.log" 2>&1 &
  PIDS+=($!)
done

targets() { local t="" ip; for ip in "$@"; do t+="'$ip',"; done; echo "[${t%,}]"; }
cat >"$DIR/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: pserver-shard
    static_configs: [{targets: $(targets "${SHARD_IP[0]}:9100" "${SHARD_IP[1]}:9100"), labels: {role: shard}}]
  - job_name: pserver-worker
    static_configs: [{targets: $(targets "${WORKER_IP[@]/%/:9200}"), labels: {role: worker}}]
YAML
promtool check config "$DIR/prometheus.yml" >/dev/null || fail "promtool rejects the generated config"
ip netns exec "$TAG-prom" prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/tsdb" \
  --web.listen-address=127.0.0.1:9090 >"$DIR/prometheus.log" 2>&1 &
PIDS+=($!)

# The Compose gate, across the bridge: a worker starts only when both shards'
# process-wide health service ("") answers SERVING.
for s in 0 1; do
  ok=0
  for _ in $(seq 100); do
    if in_ns w0 "$PROBE" --address="${SHARD_IP[$s]}:50051" --timeout=1 >/dev/null; then ok=1; break; fi
    sleep 0.1
  done
  [[ $ok == 1 ]] || fail "shard $s never reported SERVING to the health probe from w0's namespace"
done
# No model registered yet: the pserver service is not serving.
in_ns w0 "$PROBE" --address="${SHARD_IP[0]}:50051" --service=pserver.v1.ParameterServer \
  >"$DIR/probe.out" && fail "pserver.v1.ParameterServer serves before any worker registered"
grep -q NOT_SERVING "$DIR/probe.out" || fail "probe said: $(cat "$DIR/probe.out")"

worker_pids=()
for w in 0 1 2 3; do
  ip netns exec "$TAG-w$w" "$WORKER" --servers="${SHARD_IP[0]}:50051,${SHARD_IP[1]}:50051" \
    --worker_id=$w --num_workers=4 --steps="$STEPS" --batch_size=32 \
    --train_subset=20000 --test_subset=2000 --push_codec=onebit --warmup_codec=bf16 \
    --k_fraction=0.01 --metrics_listen="${WORKER_IP[$w]}:9200" --progress=lines \
    --log_interval=1000 --summary_json="$DIR/w$w.json" >"$DIR/worker$w.log" 2>&1 &
  worker_pids+=($!)
  PIDS+=($!)
done

promql() {  # promql EXPR [TIME]: the API's JSON answer to an instant query
  local at=(); [[ $# -ge 2 ]] && at=(--data-urlencode "time=$2")
  in_ns prom curl -sf --max-time 5 http://127.0.0.1:9090/api/v1/query \
    --data-urlencode "query=$1" "${at[@]}"
}
result_count() { python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))'; }
# value EXPR [TIME]: a scalar query's value as an integer (0 when it has no
# result or Prometheus does not answer).
value() {
  promql "$@" | python3 -c 'import json,sys
r = json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)' || echo 0
}

# While they train: every daemon up, then every dashboard query has data.
up=0
for _ in $(seq 120); do
  up=$(value 'count(up == 1)')
  [[ "$up" == 6 ]] && break
  sleep 0.5
done
[[ "$up" == 6 ]] || fail "Prometheus sees $up of 6 daemons up"
echo "netns: Prometheus sees all 6 daemons up after $(( $(date +%s) - start )) s"
# The checkpoint-age panel has data once both shards wrote their first
# checkpoint (round 100): on a loaded machine that can take longer than the
# few seconds below, so wait for it first.
ckpt=0
for _ in $(seq 240); do
  ckpt=$(value 'count(pserver_server_last_checkpoint_timestamp_seconds > 0)')
  [[ "$ckpt" == 2 ]] && break
  sleep 0.5
done
[[ "$ckpt" == 2 ]] || fail "Prometheus sees $ckpt of 2 shards with a checkpoint after 120 s"
# The dashboard's queries are evaluated at a moment a few scrapes (1 s
# apart) into training, since rate() needs several samples, once training is
# over; every daemon must still have been up then.
at=$(( $(date +%s) + 4 ))
for w in 0 1 2 3; do
  wait "${worker_pids[$w]}" || fail "worker $w exited non-zero"
done
(( $(date +%s) > at + 1 )) || sleep $(( at + 2 - $(date +%s) ))
live=$(value 'count(up == 1)' "$at")
[[ "$live" == 6 ]] || fail "only $live daemons were up at the query time (raise STEPS: training too short)"
python3 - "$DASHBOARD" >"$DIR/exprs" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["panels"]:
    for t in p.get("targets", []):
        print(p["title"] + "\t" + t["expr"])
PY
empty=()
while IFS=$'\t' read -r title expr; do
  # Nothing is rejected in a healthy run: that panel may be empty.
  [[ "$expr" == *rejected* ]] && continue
  n=$(promql "$expr" "$at" | result_count) || n=0
  [[ "$n" -gt 0 ]] || empty+=("$title: $expr")
done <"$DIR/exprs"
[[ ${#empty[@]} -eq 0 ]] || fail "dashboard queries without data: $(printf '%s; ' "${empty[@]}")"
echo "netns: all $(wc -l <"$DIR/exprs") dashboard queries have data"

acc=$(sed -n 's/.*"test_accuracy": \([0-9.e+-]*\).*/\1/p' "$DIR/w0.json")
awk -v a="$acc" 'BEGIN{exit !(a > 0.6)}' || fail "test accuracy $acc is not well above chance"
steps=$(promql 'min(pserver_server_step)' | python3 -c 'import json,sys
print(int(float(json.load(sys.stdin)["data"]["result"][0]["value"][1])))')
[[ "$steps" == "$STEPS" ]] || fail "Prometheus reports shards at step $steps, expected $STEPS"
in_ns w0 "$PROBE" --address="${SHARD_IP[1]}:50051" --service=pserver.v1.ParameterServer ||
  fail "pserver.v1.ParameterServer is not serving after training"
for s in 0 1; do kill -TERM "${PIDS[$s]}"; done
for s in 0 1; do wait "${PIDS[$s]}" || fail "shard $s did not exit 0 on SIGTERM"; done
echo "PASS: 2 shards + 4 workers in 7 namespaces over a bridge, accuracy $acc after $STEPS steps," \
  "Prometheus saw every daemon up and data for every dashboard query ($(( $(date +%s) - start )) s)"
