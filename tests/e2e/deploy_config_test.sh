#!/usr/bin/env bash
# Offline validation of everything under deploy/ that this machine cannot run
# for real (no Grafana, no Kubernetes), plus the health probe:
#  - promtool accepts the Prometheus configs;
#  - `docker-compose config` (Debian's 1.29) accepts the Compose files (the
#    dedicated and the co-located layout) and the env file, and the results
#    have the topologies docs/deploy.md describes;
#  - the Kubernetes manifests parse and carry the required fields (and
#    `kubectl kustomize` renders them and the co-located overlay, where
#    kubectl is installed);
#  - the Grafana dashboard is valid JSON and every metric its queries name is
#    in a live scrape of real daemons (2 shards, 2 workers, on loopback),
#    whose /metrics also pass `promtool check metrics`;
#  - pserver_health_probe answers as the healthchecks rely on.
#
#   tests/e2e/deploy_config_test.sh SERVER_BIN WORKER_BIN PROBE_BIN
set -euo pipefail
SERVER="$1"; WORKER="$2"; PROBE="$3"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CHECKS="$ROOT/tests/e2e/deploy_checks.py"
DIR="$(mktemp -d /tmp/pserver-deploycfg.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$DIR"/*.log; do [[ -f $f ]] && { echo "== $f"; tail -5 "$f"; }; done >&2; exit 1; }
skipped=()

# A python3 with the yaml module (Debian's python3-yaml is for /usr/bin/python3).
PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import yaml' 2>/dev/null; then PY="$p"; break; fi
done
[[ -n "$PY" ]] || { echo "FAIL: no python3 with the yaml module (apt-get install python3-yaml); tests/run.sh installs it"; exit 1; }
command -v promtool >/dev/null || { echo "FAIL: promtool is not installed (apt-get install prometheus); tests/run.sh installs it"; exit 1; }
command -v curl >/dev/null || { echo "FAIL: curl is not installed; tests/run.sh installs it"; exit 1; }

# --- Prometheus configs.
promtool check config "$ROOT/deploy/prometheus/prometheus.yml" >/dev/null ||
  fail "promtool rejects deploy/prometheus/prometheus.yml"
sed -e "s|targets: \[.*\] *# local.sh|targets: ['127.0.0.1:9100', '127.0.0.1:9200']|" \
  "$ROOT/deploy/prometheus/local.yml" >"$DIR/local.yml"
cp "$ROOT/deploy/prometheus/alerts.yml" "$DIR/alerts.yml"
promtool check config "$DIR/local.yml" >/dev/null || fail "promtool rejects deploy/prometheus/local.yml as local.sh fills it"
promtool check config "$ROOT/deploy/prometheus/prometheus.colocated.yml" >/dev/null ||
  fail "promtool rejects deploy/prometheus/prometheus.colocated.yml"
echo "ok: promtool check config (prometheus.yml, local.yml, prometheus.colocated.yml)"

# --- Compose.
# shellcheck source=../../deploy/packages.sh
source "$ROOT/deploy/packages.sh"
if ! command -v docker-compose >/dev/null; then
  pserver_install_packages "${PSERVER_COMPOSE_CONFIG_PACKAGES[@]}" >"$DIR/apt.log" 2>&1 || true
fi
if command -v docker-compose >/dev/null; then
  (cd "$ROOT/deploy" && docker-compose -f docker-compose.yml config) >"$DIR/compose.yml" 2>"$DIR/compose.err" ||
    fail "docker-compose config rejects deploy/docker-compose.yml: $(cat "$DIR/compose.err")"
  "$PY" "$CHECKS" compose "$DIR/compose.yml" "$ROOT/deploy/prometheus/prometheus.yml" || fail "compose checks"
  (cd "$ROOT/deploy" && docker-compose -f docker-compose.colocated.yml config) >"$DIR/colocated.yml" 2>"$DIR/compose.err" ||
    fail "docker-compose config rejects deploy/docker-compose.colocated.yml: $(cat "$DIR/compose.err")"
  "$PY" "$CHECKS" compose-colocated "$DIR/colocated.yml" "$ROOT/deploy/prometheus/prometheus.colocated.yml" ||
    fail "co-located compose checks"
  (cd "$ROOT/deploy" && docker-compose -f docker-compose.machines.yml config) >"$DIR/machines.yml" 2>"$DIR/compose.err" ||
    fail "docker-compose config rejects deploy/docker-compose.machines.yml: $(cat "$DIR/compose.err")"
  "$PY" "$CHECKS" compose-machines "$DIR/machines.yml" || fail "machines compose checks"
  echo "ok: docker-compose config + topology checks (docker-compose.yml, docker-compose.colocated.yml, docker-compose.machines.yml)"
else
  skipped+=("docker-compose is not installable here: Compose file not validated")
fi
# Every source the Dockerfile copies (its COPY lines, not the stage copies).
copied=$(awk '$1 == "COPY" && $2 !~ /^--/ {print $2}' "$ROOT/deploy/Dockerfile")
[[ -n "$copied" ]] || fail "found no COPY lines in deploy/Dockerfile"
for f in $copied; do
  [[ -e "$ROOT/$f" ]] || fail "deploy/Dockerfile copies $f, which does not exist"
  grep -q "^!$f" "$ROOT/.dockerignore" || fail ".dockerignore does not let $f into the build context"
done
grep -q '^\*$' "$ROOT/.dockerignore" || fail ".dockerignore does not start from excluding everything (build trees)"

# --- Kubernetes.
"$PY" "$CHECKS" k8s "$ROOT/deploy/k8s" || fail "k8s checks"
if command -v kubectl >/dev/null; then
  timeout 60 kubectl kustomize "$ROOT/deploy/k8s" >"$DIR/k8s.yaml" 2>"$DIR/k8s.err" ||
    fail "kubectl kustomize deploy/k8s failed: $(cat "$DIR/k8s.err")"
  "$PY" "$CHECKS" k8s "$DIR/k8s.yaml" || fail "k8s checks on the kustomize output"
  timeout 60 kubectl kustomize "$ROOT/deploy/k8s-colocated" >"$DIR/k8s-colocated.yaml" 2>"$DIR/k8s.err" ||
    fail "kubectl kustomize deploy/k8s-colocated failed: $(cat "$DIR/k8s.err")"
  "$PY" "$CHECKS" k8s-colocated "$DIR/k8s-colocated.yaml" || fail "co-located k8s checks on the kustomize output"
  timeout 60 kubectl kustomize "$ROOT/deploy/k8s-machines" >"$DIR/k8s-machines.yaml" 2>"$DIR/k8s.err" ||
    fail "kubectl kustomize deploy/k8s-machines failed: $(cat "$DIR/k8s.err")"
  "$PY" "$CHECKS" k8s-machines "$DIR/k8s-machines.yaml" || fail "machines k8s checks on the kustomize output"
  echo "ok: k8s manifests (schema-level checks; kubectl kustomize renders them, the co-located overlay and the machines)"
else
  echo "ok: k8s manifests (schema-level checks; kubectl not installed, kustomize rendering not tried)"
fi

# --- Live daemons: health probe, scrapes, dashboard.
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
servers=(); shard_metrics=()
for s in 0 1; do
  m=$(free_port)
  "$SERVER" --shard_index=$s --num_shards=2 --num_workers=2 --listen=127.0.0.1:0 \
    --metrics_listen="127.0.0.1:$m" --port_file="$DIR/port$s" --freeze_step=20 \
    --checkpoint_dir="$DIR/ckpt$s" --checkpoint_every=50 \
    >"$DIR/shard$s.log" 2>&1 &
  PIDS+=($!); shard_metrics+=("$m")
done
for s in 0 1; do
  for _ in $(seq 200); do [[ -s "$DIR/port$s" ]] && break; sleep 0.05; done
  [[ -s "$DIR/port$s" ]] || fail "shard $s did not start"
  servers+=("127.0.0.1:$(cat "$DIR/port$s")")
done
"$PROBE" --address="${servers[0]}" >"$DIR/probe.out" || fail "probe: service \"\" not SERVING: $(cat "$DIR/probe.out")"
if "$PROBE" --address="${servers[0]}" --service=pserver.v1.ParameterServer >"$DIR/probe.out"; then
  fail "probe: pserver.v1.ParameterServer SERVING before any worker registered"
fi
grep -q 'is NOT_SERVING' "$DIR/probe.out" || fail "probe: unexpected answer: $(cat "$DIR/probe.out")"
if "$PROBE" --address="${servers[0]}" --service=no.such.Service >"$DIR/probe.out"; then
  fail "probe: an unknown service counted as SERVING"
fi
grep -q 'RPC failed' "$DIR/probe.out" || fail "probe: unexpected answer: $(cat "$DIR/probe.out")"
dead=$(free_port)
t0=$(date +%s%N)
if "$PROBE" --address="127.0.0.1:$dead" --timeout=1 >"$DIR/probe.out"; then fail "probe: a closed port counted as SERVING"; fi
(( ($(date +%s%N) - t0) / 1000000 < 3000 )) || fail "probe: did not give up within its --timeout"
[[ $(wc -l <"$DIR/probe.out") -eq 1 ]] || fail "probe: more than one line on failure"
echo "ok: pserver_health_probe (\"\" SERVING; pserver.v1.ParameterServer NOT_SERVING before registration; unknown service and closed port fail)"

worker_metrics=(); worker_pids=()
for w in 0 1; do
  m=$(free_port)
  "$WORKER" --servers="${servers[0]},${servers[1]}" --worker_id=$w --num_workers=2 \
    --steps=100000 --batch_size=32 --train_subset=5000 --test_subset=500 \
    --push_codec=onebit --warmup_codec=bf16 --metrics_listen="127.0.0.1:$m" \
    --progress=lines --log_interval=1000 >"$DIR/worker$w.log" 2>&1 &
  PIDS+=($!); worker_pids+=($!); worker_metrics+=("$m")
done
# Past the freeze (stage 2) so every series has moved at least once.
for _ in $(seq 300); do
  stage=$(curl -sf "http://127.0.0.1:${shard_metrics[0]}/metrics" |
          awk '/^pserver_server_optimizer_stage/ {print $2}') || true
  [[ "$stage" == 2 ]] && break
  sleep 0.1
done
[[ "$stage" == 2 ]] || fail "shard 0 never reached the compression stage"
"$PROBE" --address="${servers[0]}" --service=pserver.v1.ParameterServer >"$DIR/probe.out" ||
  fail "probe: pserver.v1.ParameterServer not SERVING after registration: $(cat "$DIR/probe.out")"
# A worker whose model layout differs is refused: a rejected request (and a
# non-empty rejected_requests_total family) without harming training.
"$WORKER" --servers="${servers[0]},${servers[1]}" --worker_id=1 --num_workers=2 --hidden=64 \
  --steps=1 --rpc_timeout=2 --retry_budget=2 >"$DIR/bad-worker.log" 2>&1 &&
  fail "a worker with another model layout was accepted"
scrapes=()
for m in "${shard_metrics[@]}" "${worker_metrics[@]}"; do
  curl -sf "http://127.0.0.1:$m/metrics" >"$DIR/scrape$m.txt" || fail "no /metrics on port $m"
  promtool check metrics <"$DIR/scrape$m.txt" >"$DIR/lint$m.txt" 2>&1 ||
    fail "promtool check metrics on port $m: $(cat "$DIR/lint$m.txt")"
  scrapes+=("$DIR/scrape$m.txt")
done
for w in 0 1; do kill -0 "${worker_pids[$w]}" 2>/dev/null || fail "worker $w died"; done
"$PY" "$CHECKS" dashboard "$ROOT/deploy/grafana/dashboards/pserver.json" "${scrapes[@]}" ||
  fail "dashboard checks"
for f in "$ROOT"/deploy/grafana/provisioning/*/*.yml; do
  "$PY" -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); assert d["apiVersion"] == 1' "$f" ||
    fail "$f is not a Grafana provisioning file"
done
grep -q 'uid: pserver-prometheus' "$ROOT/deploy/grafana/provisioning/datasources/prometheus.yml" ||
  fail "the provisioned data source's uid is not the one the dashboard uses"
echo "ok: dashboard JSON, metric names in live scrapes, promtool check metrics on 4 endpoints"

for s in "${skipped[@]}"; do echo "SKIPPED PART: $s"; done
echo "PASS: deploy configuration"
