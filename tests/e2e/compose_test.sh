#!/usr/bin/env bash
# The real Compose stack: builds the images with deploy/Dockerfile on a local
# debootstrap base, runs deploy/docker-compose.yml (with the small override
# tests/e2e/compose/docker-compose.test.yml: local base image, Prometheus
# from Debian's package, no Grafana, short training), and checks that
#  - every worker finishes training (exit 0, accuracy well above chance),
#  - Prometheus reports all 6 daemons (2 shards, 4 workers) `up` while they train,
#  - a shard killed from outside Docker (a crash) is restarted by its policy,
#    turns healthy again and is scraped again.
# Then removes everything it created: containers, networks, volumes, images,
# build cache, the dockerd it started and any firewall rules that daemon left.
# PSERVER_TEST_LAYOUT=colocated runs deploy/docker-compose.colocated.yml
# instead (override tests/e2e/compose/docker-compose.colocated.test.yml): 4
# nodes, each a shard and a worker in one network namespace; the same checks
# with 8 daemons, and the killed shard must come back in its node's
# namespace (Prometheus scrapes it there by the node's alias).
# PSERVER_TEST_LAYOUT=machines runs deploy/docker-compose.machines.yml (the
# launcher in each "machine" container; override
# tests/e2e/compose/docker-compose.machines.test.yml): machine0 and two
# replicas of the scaled service, which claim their node ranks and join the
# running job; one replica is stopped (SIGTERM) after both joined and must
# leave (exit 0, its workers out at their next round, nothing dropped) while
# the others train to the end.
#
#   tests/e2e/compose_test.sh   (root; measured 10 min on 2 busy cores, 9 of them
#                                building the images; ~3 min more for debootstrap
#                                when the base tarball is not cached yet)
# Environment: PSERVER_TEST_CACHE (default /var/cache/pserver-test) keeps the
# debootstrap base tarball between runs; PSERVER_TEST_STEPS (default 1500: on a
# quiet machine 400 steps took 3 s, less than the 5 s scrape interval);
# PSERVER_TEST_SOURCES builds another source tree than this checkout;
# PSERVER_TEST_MIRROR is the Debian mirror for debootstrap (default: the one
# apt uses here, else http://deb.debian.org/debian).
#
# Every failure says why: fail() names what went wrong, and any other command
# that stops the script is reported with its line and exit status.
set -Eeuo pipefail
trap 'echo "compose_test: line $LINENO: \`$BASH_COMMAND\` exited with $?" >&2' ERR
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${PSERVER_TEST_CACHE:-/var/cache/pserver-test}"
BASE_TAR="$CACHE/bookworm-minbase.tar"
export PSERVER_TEST_STEPS="${PSERVER_TEST_STEPS:-1500}"
export PSERVER_TEST_TAG="t$$"
export PSERVER_BASE_IMAGE="pserver-test-base:t$$"
PROJECT="pserver-test-$$"
DIR="$(mktemp -d /tmp/pserver-compose.XXXXXX)"
start=$(date +%s)
skip() { echo "SKIP: $*"; exit 77; }
log() { echo "compose_test [$(( $(date +%s) - start ))s]: $*"; }

[[ $(id -u) -eq 0 ]] || skip "needs root (starts its own dockerd)"
# shellcheck source=../../deploy/packages.sh
source "$ROOT/deploy/packages.sh"
pserver_install_packages "${PSERVER_COMPOSE_RUN_PACKAGES[@]}" >"$DIR/apt.log" 2>&1 ||
  skip "cannot install ${PSERVER_COMPOSE_RUN_PACKAGES[*]}: $(tail -1 "$DIR/apt.log")"
command -v curl >/dev/null || skip "curl is not installed"
# Debian's client matches Debian's engine; docker-compose runs `docker build`
# through whichever `docker` is first on PATH, so make it that one.
DOCKER=/usr/bin/docker; [[ -x $DOCKER ]] || DOCKER=$(command -v docker)
mkdir -p "$DIR/bin" && ln -s "$DOCKER" "$DIR/bin/docker"
export PATH="$DIR/bin:$PATH" DOCKER_BUILDKIT=0
# The build context is a snapshot of the sources: every service's build sends
# it again, and a file edited in between would rebuild everything.
SRC="$DIR/src"
mkdir -p "$SRC"
tar -C "${PSERVER_TEST_SOURCES:-$ROOT}" -c CMakeLists.txt .dockerignore proto common server tune worker python deploy tests/e2e/compose |
  tar -C "$SRC" -x
case "${PSERVER_TEST_LAYOUT:-dedicated}" in
  dedicated)
    COMPOSE=(docker-compose -p "$PROJECT" -f "$SRC/deploy/docker-compose.yml"
             -f "$SRC/tests/e2e/compose/docker-compose.test.yml")
    shards=(shard0 shard1)
    services=(shard0 shard1 worker0 worker1 worker2 worker3 prometheus) ;;
  colocated)
    COMPOSE=(docker-compose -p "$PROJECT" -f "$SRC/deploy/docker-compose.colocated.yml"
             -f "$SRC/tests/e2e/compose/docker-compose.colocated.test.yml")
    shards=(shard0 shard1 shard2 shard3)
    services=(node0 node1 node2 node3 shard0 shard1 shard2 shard3
              worker0 worker1 worker2 worker3 prometheus) ;;
  machines)
    COMPOSE=(docker-compose -p "$PROJECT" -f "$SRC/deploy/docker-compose.machines.yml"
             -f "$SRC/tests/e2e/compose/docker-compose.machines.test.yml")
    # Long enough for two machines to start and join (seconds each).
    export PSERVER_TEST_STEPS="${PSERVER_TEST_STEPS_MACHINES:-12000}"
    shards=(); services=(machine0 machine) ;;
  *) echo "compose_test: PSERVER_TEST_LAYOUT is '$PSERVER_TEST_LAYOUT'; expected dedicated, colocated or machines" >&2
     rm -rf "$DIR"; exit 2 ;;
esac
daemons=$(( ${#shards[@]} + 4 ))

DOCKERD_PID=""
firewall_state() { { iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } | grep -v '^#' | sed 's/\[[0-9:]*\]//'; }
firewall_state >"$DIR/firewall.before" || true
ip -o link show | awk -F': ' '{print $2}' | sort >"$DIR/links.before"

cleanup() {
  local code=$?
  # Best effort from here on: a cleanup step that finds nothing to do (no
  # mounts left, no rules) must not end the cleanup half-way.
  set +e
  trap - EXIT INT TERM ERR
  if [[ $code -ne 0 ]]; then
    echo "== compose logs (tail)" >&2
    "${COMPOSE[@]}" logs --no-color --tail=10 >&2 2>/dev/null || true
  fi
  log "tearing down"
  "${COMPOSE[@]}" down --volumes --remove-orphans --rmi all --timeout 30 >"$DIR/down.log" 2>&1 || true
  $DOCKER rmi -f "$PSERVER_BASE_IMAGE" >/dev/null 2>&1 || true
  $DOCKER image prune -f >/dev/null 2>&1 || true   # dangling build stages
  $DOCKER builder prune -af >/dev/null 2>&1 || true
  if [[ -n "$DOCKERD_PID" ]]; then
    kill "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$DOCKERD_PID" 2>/dev/null || true
    [[ -f "$DIR/containerd.pid" ]] && kill "$(cat "$DIR/containerd.pid")" 2>/dev/null || true
    # Mounts the engine may have left under its roots, then the roots.
    grep -o " $DIR/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    # Firewall rules and chains the daemon made (it should make none with
    # --iptables=false; this covers an engine that ignored that).
    firewall_state >"$DIR/firewall.after" || true
    if ! cmp -s "$DIR/firewall.before" "$DIR/firewall.after"; then
      for cmd in iptables ip6tables; do
        for table in nat filter; do
          for chain in $($cmd -t $table -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
            $cmd -t $table -S 2>/dev/null | grep -- "-j $chain\b" | sed 's/^-A/-D/' |
              while read -r rule; do eval "$cmd -t $table $rule" 2>/dev/null || true; done
          done
          for chain in $($cmd -t $table -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
            $cmd -t $table -F "$chain" 2>/dev/null || true
          done
          for chain in $($cmd -t $table -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
            $cmd -t $table -X "$chain" 2>/dev/null || true
          done
        done
      done
      firewall_state >"$DIR/firewall.after" || true
      cmp -s "$DIR/firewall.before" "$DIR/firewall.after" ||
        { echo "compose_test: firewall differs from before the test:" >&2; diff "$DIR/firewall.before" "$DIR/firewall.after" >&2 || true; }
    fi
    # Bridges the daemon made and did not remove.
    ip -o link show | awk -F': ' '{print $2}' | sort >"$DIR/links.after"
    for l in $(comm -13 "$DIR/links.before" "$DIR/links.after" | grep -E '^(br-|docker|veth)' | cut -d@ -f1); do
      ip link delete "$l" 2>/dev/null || true
    done
  fi
  rm -rf "$DIR"
  log "done (exit $code)"
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

# --- The engine: the one reachable, or our own.
if $DOCKER info >/dev/null 2>&1; then
  log "using the Docker engine at ${DOCKER_HOST:-the default socket}"
else
  mkdir -p "$DIR/data" "$DIR/exec"
  # No --iptables: nothing here needs NAT (builds use the host network, the
  # stack talks over its own bridge, the published port goes through
  # docker-proxy), and the host's firewall stays as it was.
  dockerd --data-root "$DIR/data" --exec-root "$DIR/exec" -H "unix://$DIR/docker.sock" \
    --pidfile "$DIR/dockerd.pid" --iptables=false --ip6tables=false --bridge=none \
    >"$DIR/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  export DOCKER_HOST="unix://$DIR/docker.sock"
  for _ in $(seq 60); do $DOCKER info >/dev/null 2>&1 && break; sleep 0.5; done
  $DOCKER info >/dev/null 2>&1 ||
    skip "the Docker engine does not start here: $(tail -2 "$DIR/dockerd.log" | tr '\n' ' ')"
  log "started a private dockerd (pid $DOCKERD_PID)"
fi

# --- The base image: debootstrap once, cached as a tarball.
# shellcheck source=compose/apt_mirror.sh
source "$ROOT/tests/e2e/compose/apt_mirror.sh"
if [[ ! -s "$BASE_TAR" ]]; then
  mirror="${PSERVER_TEST_MIRROR:-$(apt_debian_mirror)}"
  if [[ -z "$mirror" ]]; then
    mirror=http://deb.debian.org/debian
    log "no Debian archive in /etc/apt/sources.list{,.d/*.list,.d/*.sources}; using $mirror"
  fi
  log "debootstrap bookworm from $mirror (cached in $CACHE afterwards)"
  mkdir -p "$CACHE"
  rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$DIR/debootstrap.log" 2>&1 ||
    { rm -rf "$rootfs"; fail "debootstrap failed: $(tail -2 "$DIR/debootstrap.log")"; }
  tar -C "$rootfs" -c . >"$BASE_TAR.tmp" && mv "$BASE_TAR.tmp" "$BASE_TAR"
  rm -rf "$rootfs"
fi
$DOCKER import "$BASE_TAR" "$PSERVER_BASE_IMAGE" >/dev/null
log "base image $PSERVER_BASE_IMAGE imported"

cid() { "${COMPOSE[@]}" ps -q "$1"; }
if [[ ${PSERVER_TEST_LAYOUT:-dedicated} == machines ]]; then
  source "$ROOT/tests/e2e/compose/machines_checks.sh"
  machines_checks
  exit 0
fi

# --- Build (the real Dockerfile) and start.
(cd "$SRC/deploy" && "${COMPOSE[@]}" build shard0 worker0 prometheus) >"$DIR/build.log" 2>&1 ||
  fail "image build failed: $(tail -5 "$DIR/build.log")"
log "images built"
PROM_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export PROMETHEUS_PORT="$PROM_PORT"
(cd "$SRC/deploy" && "${COMPOSE[@]}" up -d --no-build "${services[@]}") >"$DIR/up.log" 2>&1 ||
  fail "compose up failed: $(tail -5 "$DIR/up.log")"
log "stack up (Prometheus on 127.0.0.1:$PROM_PORT)"

state() { $DOCKER inspect -f '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$(cid "$1")"; }
promql() {
  curl -sf --max-time 5 "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)'
}

# --- While training: every daemon up in Prometheus; then every worker done.
max_up=0
deadline=$(( $(date +%s) + 900 ))
while :; do
  up=$(promql 'count(up == 1)' 2>/dev/null || echo 0)
  (( up > max_up )) && max_up=$up
  done_count=0
  for w in 0 1 2 3; do
    read -r status code restarts _ <<<"$(state "worker$w")"
    [[ "$restarts" == 0 ]] || fail "worker$w failed and was restarted: $("${COMPOSE[@]}" logs --tail=5 "worker$w" 2>&1)"
    if [[ "$status" == exited ]]; then
      [[ "$code" == 0 ]] || fail "worker$w exited with $code"
      done_count=$((done_count + 1))
    fi
  done
  [[ $done_count == 4 ]] && break
  (( $(date +%s) < deadline )) || fail "training did not finish in 15 min"
  sleep 1
done
# Each daemon scraped up at least once while the stack ran (a worker that
# finishes between two scrapes of the others never shows in an instant query
# together with all of them, so "at once" is logged, not required).
ever_up=$(promql 'count(max_over_time(up[15m]) == 1)' 2>/dev/null || echo 0)
[[ "$ever_up" == "$daemons" ]] ||
  fail "Prometheus saw $ever_up of the $daemons daemons up during training (at most $max_up at once)"
log "all 4 workers finished; Prometheus saw all $daemons daemons up ($max_up at once)"
for w in 0 1 2 3; do
  "${COMPOSE[@]}" logs --no-color "worker$w" >"$DIR/worker$w.log" 2>&1
done
acc=""
for w in 0 1 2 3; do
  a=$(sed -n 's/.*worker [0-9]* done: .*test accuracy \([0-9.]*\).*/\1/p' "$DIR/worker$w.log" | tail -1)
  [[ -n "$a" ]] || fail "worker$w printed no final line: $(tail -3 "$DIR/worker$w.log")"
  awk -v a="$a" 'BEGIN{exit !(a > 0.6)}' || fail "worker$w: test accuracy $a is not well above chance"
  acc+="$a "
done
# The last scrape may predate the last rounds (training outpaces the 5 s
# interval): wait a few scrapes for every shard's final step.
for _ in $(seq 30); do
  steps=$(promql 'min(pserver_server_step)' 2>/dev/null || echo 0)
  [[ "$steps" == "$PSERVER_TEST_STEPS" ]] && break
  sleep 1
done
[[ "$steps" == "$PSERVER_TEST_STEPS" ]] || fail "shards report step $steps, expected $PSERVER_TEST_STEPS"

# --- A crashed shard comes back by its restart policy.
read -r _ _ restarts_before _ <<<"$(state shard0)"
pid=$($DOCKER inspect -f '{{.State.Pid}}' "$(cid shard0)")
kill -9 "$pid"
log "killed shard0 (host pid $pid) with SIGKILL"
ok=0
for _ in $(seq 120); do
  read -r status _ restarts health <<<"$(state shard0)"
  if [[ "$status" == running && "$restarts" -gt "$restarts_before" && "$health" == healthy ]]; then ok=1; break; fi
  sleep 1
done
[[ $ok == 1 ]] || fail "shard0 was not restarted to healthy (state: $(state shard0))"
log "shard0 restarted (restart count $restarts) and healthy"
ok=0
for _ in $(seq 60); do
  [[ $(promql 'sum(up{job="pserver-shard"})' 2>/dev/null || echo 0) == "${#shards[@]}" ]] && { ok=1; break; }
  sleep 1
done
[[ $ok == 1 ]] || fail "Prometheus does not see all ${#shards[@]} shards up after the restart"

# A clean stop: SIGTERM, drain, exit 0, no restart.
(cd "$SRC/deploy" && "${COMPOSE[@]}" stop shard1) >/dev/null 2>&1
read -r status code _ <<<"$(state shard1)"
[[ "$status" == exited && "$code" == 0 ]] || fail "shard1 did not exit 0 on docker-compose stop ($status $code)"
echo "PASS: Compose stack (${PSERVER_TEST_LAYOUT:-dedicated}, ${#shards[@]} shards) trained on 4 workers (test accuracy ${acc% }), all daemons up in" \
  "Prometheus, killed shard restarted healthy, clean stop exits 0 ($(( $(date +%s) - start )) s before teardown)"
