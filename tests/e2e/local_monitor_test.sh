#!/usr/bin/env bash
# deploy/local.sh --monitor, non-interactive (stdin is not a terminal): it
# starts Debian's Prometheus on the local cluster and prints a graph URL; while
# the cluster trains, Prometheus must see every daemon up and every series of
# that URL must be a valid query with data, and so must every query of the
# Grafana dashboard (no Grafana server can run here: its panels are checked
# through their queries); the alerting rules are loaded and healthy, tell
# shards from workers by pserver_build_info, and none of the availability
# alerts is pending during healthy training; then local.sh, stopped with
# SIGTERM as an operator would (the run is long enough, 50 epochs, that it is
# still training however fast the machine), exits 130 and leaves nothing
# running. (local_cluster_test covers the exit 0 of a run that completes.)
#
#   tests/e2e/local_monitor_test.sh BUILD_DIR
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export BUILD_DIR="$1"
DIR="$(mktemp -d /tmp/pserver-monitor.XXXXXX)"
PID=""
cleanup() {
  [[ -n "$PID" ]] && kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -20 "$DIR/out.log" >&2; exit 1; }
for tool in prometheus curl python3; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed; tests/run.sh installs it"; exit 1; }
done

# Free ports: 2 consecutive for each of shards, shard metrics, worker metrics.
read -r base mbase wbase pport < <(python3 - <<'PY'
import random, socket
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port)); return True
    except OSError:
        return False
    finally:
        s.close()
picked = []
while len(picked) < 4:
    p = random.randrange(20000, 30000, 10)
    if all(free(p + i) for i in range(2)) and p not in picked:
        picked.append(p)
print(*picked)
PY
)
BASE_PORT=$base METRICS_PORT=$mbase WORKER_METRICS_PORT=$wbase PROMETHEUS_PORT=$pport \
  "$ROOT/deploy/local.sh" --monitor --shards 2 --workers 2 --steps 0 --epochs 50 \
  --run-dir "$DIR/run" </dev/null >"$DIR/out.log" 2>&1 &
PID=$!

url=""
for _ in $(seq 600); do
  url=$(sed -n 's/.*key series: \(http[^ ]*\).*/\1/p' "$DIR/out.log")
  [[ -n "$url" ]] && break
  kill -0 "$PID" 2>/dev/null || fail "local.sh ended before printing the graph URL"
  sleep 0.5
done
[[ -n "$url" ]] || fail "no graph URL printed"
[[ "$url" == "http://127.0.0.1:$pport/graph?"* ]] || fail "unexpected URL $url"
curl -sf -o /dev/null "$url" || fail "the graph URL does not load: $url"

api() { curl -sf --max-time 5 "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; }
count() { python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["status"]=="success"; print(len(d["data"]["result"]))'; }
up=0
for _ in $(seq 240); do
  up=$(api 'up == 1' | count 2>/dev/null || echo 0)
  [[ "$up" == 4 ]] && break
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.25
done
[[ "$up" == 4 ]] || fail "Prometheus saw $up of the 4 daemons up"
sleep 11   # two scrapes at the 5 s interval of deploy/prometheus/local.yml
python3 - "$url" >"$DIR/exprs" <<'PY'
import sys, urllib.parse
q = urllib.parse.parse_qs(urllib.parse.urlparse(sys.argv[1]).query)
for k in sorted(k for k in q if k.endswith(".expr")):
    print(q[k][0])
PY
[[ $(wc -l <"$DIR/exprs") -ge 5 ]] || fail "the graph URL holds only $(wc -l <"$DIR/exprs") series"
kill -0 "$PID" 2>/dev/null || fail "training ended before the series could be checked"
while read -r expr; do
  n=$(api "$expr" | count) || fail "Prometheus rejects the URL's query: $expr"
  [[ "$n" -gt 0 ]] || fail "no data for the URL's query: $expr"
done <"$DIR/exprs"
# Every query of the dashboard: accepted, with data. Only "Checkpoint age"
# may be empty: local.sh runs the shards without --checkpoint_dir. The
# diagnostics and fault counters start at 0, so their panels have data
# before any event.
python3 "$ROOT/tests/e2e/dashboard_queries.py" "$ROOT/deploy/grafana/dashboards/pserver.json" \
  "http://127.0.0.1:$pport" --may-be-empty="Checkpoint age, by shard" >"$DIR/queries.log" ||
  { grep FAIL "$DIR/queries.log" >&2; fail "dashboard queries (above)"; }
kill -0 "$PID" 2>/dev/null || fail "training ended while the dashboard's queries ran"
# The availability rules find shards and workers by pserver_build_info's
# component, whatever the job is called (here one job, "pserver").
for c in server worker; do
  n=$(api "up == 1 and on (job, instance) last_over_time(pserver_build_info{component=\"$c\"}[1d])" | count) ||
    fail "Prometheus rejects the rules' $c selector"
  [[ "$n" == 2 ]] || fail "the rules' $c selector finds $n targets, expected 2"
done
# The alerting rules (deploy/prometheus/alerts.yml) are loaded, evaluated
# without error, and no availability alert is pending or firing.
curl -sf --max-time 5 "http://127.0.0.1:$pport/api/v1/rules" >"$DIR/rules.json" ||
  fail "Prometheus does not answer /api/v1/rules"
python3 - "$DIR/rules.json" <<'PY' || fail "the alerting rules: $(head -c 300 "$DIR/rules.json")"
import json, sys
d = json.load(open(sys.argv[1]))
rules = [r for g in d["data"]["groups"] for r in g["rules"]]
names = {r["name"] for r in rules if r["type"] == "alerting"}
want = {"PserverLossNotFinite", "PserverStraggler", "PserverCommunicationBound",
        "PserverShardDown", "PserverWorkerDown", "PserverNoProgress",
        "PserverCheckpointFailing", "PserverWorkerDropped"}
assert want <= names, f"missing: {want - names}"
bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
assert not bad, f"not evaluated cleanly: {bad}"
quiet = {"PserverShardDown", "PserverWorkerDown", "PserverNoProgress",
         "PserverCheckpointFailing", "PserverWorkerDropped"}
active = [(a["labels"]["alertname"], a["state"]) for r in rules for a in r.get("alerts", [])
          if a["labels"]["alertname"] in quiet]
assert not active, f"active during healthy training: {active}"
PY
kill -TERM "$PID"
code=0
wait "$PID" || code=$?
PID=""
[[ $code -eq 130 ]] || fail "local.sh --monitor exited $code on SIGTERM; expected 130"
grep -q "interrupted, stopping the cluster" "$DIR/out.log" || fail "local.sh did not say it was stopping"
if curl -sf -o /dev/null "http://127.0.0.1:$pport/-/ready"; then fail "Prometheus still runs after local.sh exited"; fi
if pgrep -f "$DIR/run" >/dev/null; then fail "daemons still run after local.sh exited: $(pgrep -af "$DIR/run")"; fi
echo "PASS: local.sh --monitor: 4 daemons up in Prometheus, $(wc -l <"$DIR/exprs") graph series with data, $(tail -1 "$DIR/queries.log"), rules healthy, clean stop on SIGTERM"
