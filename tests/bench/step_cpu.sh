#!/usr/bin/env bash
# CPU seconds per step of each process (not a unit test; issue 29 section 3):
# one shard and one worker on loopback train pserver_worker's synthetic model
# with 1-bit Adam as network.sh runs it (--optimizer=onebit_adam, bf16
# warmup pushes, then 1-bit pushes and pulls, FREEZE_STEP warmup rounds).
# Each measurement is two runs, SHORT and LONG steps: the difference of the
# processes' user+sys CPU seconds (and of the wall clock), divided by
# LONG - SHORT, is what a step costs once start-up, registration and the
# warmup are over; minor page faults per step likewise (a machine that
# faults more per step shows it there). With several build folders the builds alternate, REPEAT
# times, so that they share the machine's state; medians per build.
#
#   tests/bench/step_cpu.sh [BUILD_DIR ...]      # default: build/
#   PARAMS=25000000 SHORT=12 LONG=42 REPEAT=3 FREEZE_STEP=4 (defaults)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PARAMS="${PARAMS:-25000000}" SHORT="${SHORT:-12}" LONG="${LONG:-42}"
REPEAT="${REPEAT:-3}" FREEZE_STEP="${FREEZE_STEP:-4}"
builds=("$@")
[[ ${#builds[@]} -gt 0 ]] || builds=("$ROOT/build")
for b in "${builds[@]}"; do
  for x in "$b/server/pserver_server" "$b/worker/pserver_worker"; do
    [[ -x "$x" ]] || { echo "step_cpu.sh: no $x; build first" >&2; exit 2; }
  done
done
[[ -x /usr/bin/time ]] || { echo "step_cpu.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
(( LONG > SHORT )) || { echo "step_cpu.sh: LONG ($LONG) must exceed SHORT ($SHORT)" >&2; exit 2; }
DIR="$(mktemp -d /tmp/pserver-stepcpu.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$DIR"' EXIT

run() {  # run BUILD STEPS TAG: writes TAG.server and TAG.worker ("user sys wall")
  local b=$1 steps=$2 tag=$3
  /usr/bin/time -f "%U %S %e %R" -o "$DIR/$tag.server" "$b/server/pserver_server" \
    --num_workers=1 --optimizer=onebit_adam --freeze_step="$FREEZE_STEP" \
    --pull_codec=onebit --listen=127.0.0.1:0 --metrics_listen= \
    --port_file="$DIR/$tag.port" 2>"$DIR/$tag.server.log" &
  local timer=$!
  for _ in $(seq 600); do [[ -s "$DIR/$tag.port" ]] && break; sleep 0.05; done
  [[ -s "$DIR/$tag.port" ]] || { cat "$DIR/$tag.server.log" >&2; exit 1; }
  /usr/bin/time -f "%U %S %e %R" -o "$DIR/$tag.worker" "$b/worker/pserver_worker" \
    --servers="127.0.0.1:$(cat "$DIR/$tag.port")" --model=synthetic \
    --synthetic_params="$PARAMS" --synthetic_tensors=8 --steps="$steps" \
    --push_codec=onebit --warmup_codec=bf16 --progress=lines --log_interval=1000 \
    --rpc_timeout=600 --pull_timeout=600 --metrics_listen= >"$DIR/$tag.worker.log" 2>&1 \
    || { cat "$DIR/$tag.worker.log" >&2; exit 1; }
  pkill -TERM -P "$timer" 2>/dev/null || true  # the shard, not /usr/bin/time
  wait "$timer" 2>/dev/null || true
}

for rep in $(seq "$REPEAT"); do
  for i in "${!builds[@]}"; do
    run "${builds[$i]}" "$SHORT" "b$i.r$rep.short"
    run "${builds[$i]}" "$LONG" "b$i.r$rep.long"
  done
done

/usr/bin/python3 - "$DIR" "$REPEAT" "$SHORT" "$LONG" "$PARAMS" "${builds[@]}" <<'EOF'
import os, statistics, sys
d, repeat, short, long_, params = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
builds = sys.argv[6:]
def read(tag):
    u, s, e, f = map(float, open(os.path.join(d, tag)).read().split()[-4:])
    return u + s, e, f
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
            if l.startswith("model name")), "?")
print(f"{params} parameters, 1-bit Adam, 1 shard and 1 worker on loopback; per step "
      f"from runs of {short} and {long_} steps; machine: {cpu}, {os.cpu_count()} cores")
print("%-40s %-8s %14s %14s %10s %18s" % ("build", "run", "shard CPU s", "worker CPU s",
                                          "wall s", "faults/step s, w"))
line = "%-40s %-8s %14.4f %14.4f %10.4f %9.0f %8.0f"
medians = []
for i, b in enumerate(builds):
    rows = []
    for r in range(1, repeat + 1):
        per, faults = [], []
        for who in ("server", "worker"):
            c1, w1, f1 = read(f"b{i}.r{r}.short.{who}")
            c2, w2, f2 = read(f"b{i}.r{r}.long.{who}")
            per.append((c2 - c1) / (long_ - short))
            faults.append((f2 - f1) / (long_ - short))
        wall = (w2 - w1) / (long_ - short)
        rows.append((per[0], per[1], wall, *faults))
        print(line % (b[-40:], r, *rows[-1]))
    med = tuple(statistics.median(x[k] for x in rows) for k in range(5))
    medians.append(med)
    print(line % (b[-40:], "median", *med))
if len(builds) > 1:
    base = medians[0]
    for b, m in zip(builds[1:], medians[1:]):
        print(f"{b[-40:]} against {builds[0][-40:]}: shard CPU {base[0] / m[0]:.2f}x less, "
              f"worker CPU {base[1] / m[1]:.2f}x less, wall {base[2] / m[2]:.2f}x less")
EOF
