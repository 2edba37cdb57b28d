# shellcheck shell=bash
# Shaped network namespaces for the benchmarks that run the real processes
# on a network (network.sh, time_to_loss.sh); sourced, not run (needs bash
# and root). Hosts are network namespaces, each with a veth onto one Linux
# bridge in a hub namespace of its own; netns_shape puts a tc tbf on every
# host's link in both directions (egress on the hub's end of the veth = into
# the host, egress inside the host = out of it).
#
# The caller defines die MESSAGE (exit 2: a precondition) and sets
# NETNS_PROG (its name, for messages) and NETNS_LOG_DIR (where its logs are:
# on a failed exit the last lines of NETNS_LOG_DIR/*.log and */*.log are
# printed), then:
#   netns_check_tools              root, ip and tc, or die
#   netns_rate_bps RATE            a tc rate (100mbit, 1gbit, ...) in bit/s on
#                                  stdout; fails for anything else
#   netns_default_burst BPS        tbf burst in bytes: 2 ms at BPS, >= 64 KiB
#   netns_start TAG                the hub TAG-hub with its bridge; installs
#                                  the cleanup on every exit (it stops PIDS,
#                                  kills whatever runs in the namespaces and
#                                  deletes them)
#   netns_host NAME ADDRESS        namespace TAG-NAME, ADDRESS/24 on its eth0
#   netns_shape RATE BURST LATENCY every host's link, both ways (again to
#                                  change the rate)
#   netns_kill_all                 SIGKILL to every process in the namespaces
#   tc_bytes FILE                  "HOST in|out BYTES" per host, so far
#   wait_pids SECONDS WHAT PID...  each exits 0 within SECONDS, or fail
#   stop_pids PID...               SIGTERM, 15 s, SIGKILL; all reaped
#   fail MESSAGE                   exit 1
# It keeps TAG, HUB, HOSTS (names, in order), NAMESPACES and PIDS (processes
# started and not yet reaped, which the caller appends to).

TAG=""
HUB=""
HOSTS=()
NAMESPACES=()
PIDS=()

netns_check_tools() {
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces and tc); run it with sudo"
  local tool
  for tool in ip tc; do
    command -v "$tool" >/dev/null || die "'$tool' not found; install iproute2 (apt-get install iproute2)"
  done
}

netns_rate_bps() {
  [[ "$1" =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit)$ ]] || return 1
  awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" 'BEGIN {
    m = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : (u == "kbit") ? 1e3 : 1; printf "%.0f", n * m }'
}

netns_default_burst() {
  echo $(( $1 / 8 / 500 > 65536 ? $1 / 8 / 500 : 65536 ))
}

netns_kill_all() {
  local ns pid
  for ns in "${NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
}

netns_cleanup() {
  local code=$? pid ns alive f
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0; for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break; sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  # Anything else still running in our namespaces was started by the caller.
  netns_kill_all
  wait 2>/dev/null || true
  # Deleting a namespace deletes the veth ends in it, their peers and the
  # bridge in the hub.
  for ns in "${NAMESPACES[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
  if [[ $code -ne 0 ]]; then
    echo "$NETNS_PROG: failed; logs in $NETNS_LOG_DIR, the last lines:" >&2
    for f in "$NETNS_LOG_DIR"/*.log "$NETNS_LOG_DIR"/*/*.log; do
      [[ -f "$f" ]] && { echo "== $f"; tail -5 "$f"; }
    done >&2
  fi
  exit "$code"
}

fail() { echo "$NETNS_PROG: $*" >&2; exit 1; }

netns_start() {
  TAG=$1
  HUB="$TAG-hub"
  trap netns_cleanup EXIT
  trap 'exit 130' INT TERM
  if ip netns list | grep -q "^$HUB\b"; then
    die "namespace $HUB exists already (left by a run killed with SIGKILL?); remove the $TAG-* namespaces with ip netns delete"
  fi
  ip netns add "$HUB" 2>/dev/null || die "ip netns add failed (no permission for network namespaces here)"
  NAMESPACES+=("$HUB")
  ip -n "$HUB" link set lo up
  ip -n "$HUB" link add name br0 type bridge
  ip -n "$HUB" link set br0 up
}

netns_host() {  # veth names are at most 15 characters: TAG plus NAME
  local ns="$TAG-$1"
  ip netns add "$ns"; NAMESPACES+=("$ns"); HOSTS+=("$1")
  ip -n "$ns" link set lo up
  ip link add name "$TAG$1" netns "$HUB" type veth peer name eth0 netns "$ns"
  ip -n "$HUB" link set "$TAG$1" master br0 up
  ip -n "$ns" addr add "$2/24" dev eth0
  ip -n "$ns" link set eth0 up
}

netns_shape() {
  local h
  for h in "${HOSTS[@]}"; do
    tc -n "$HUB" qdisc replace dev "$TAG$h" root tbf rate "$1" burst "$2" latency "$3"     # into the host
    tc -n "$TAG-$h" qdisc replace dev eth0 root tbf rate "$1" burst "$2" latency "$3"      # out of it
  done
}

tc_bytes() {
  local h
  for h in "${HOSTS[@]}"; do
    echo "$h in $(tc -n "$HUB" -s qdisc show dev "$TAG$h" | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p' | head -1)"
    echo "$h out $(tc -n "$TAG-$h" -s qdisc show dev eth0 | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p' | head -1)"
  done >"$1"
}

wait_pids() {
  local limit=$1 what=$2 pid code
  shift 2
  local deadline=$((SECONDS + limit))
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null; do
      (( SECONDS < deadline )) || fail "$what: still running after $limit s (raise RUN_TIMEOUT)"
      sleep 0.2
    done
    code=0; wait "$pid" || code=$?
    [[ $code -eq 0 ]] || fail "$what: a process exited with code $code"
  done
}

stop_pids() {
  local pid alive
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 150); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break; sleep 0.1
  done
  for pid in "$@"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
