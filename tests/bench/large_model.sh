#!/usr/bin/env bash
# Large-model benchmark (not a unit test): one shard holding PARAMS fp32
# parameters (default 100M) and one worker with a synthetic model, pushing
# and pulling through real gRPC on loopback in chunks (no message holds the
# model). For the fp32 codec both ways and for 1-bit both ways (Adam on the
# shard), REPEAT runs of STEPS steps each; per run:
#   s/step      median of the steps after the first (the first step also
#               builds the synthetic gradient table and the first answers)
#   push GB/s   fp32 gradient bytes pushed per second of the worker's push
#               time (encode included), and the bytes on the wire per second
#   pull GB/s   the same for pulls (decode and checksum included)
#   peak RSS    of the shard and of the worker (VmHWM, /usr/bin/time), as a
#               multiple of the model's fp32 bytes; targets (issue 10): shard
#               <= 5x its slice (x, m, v, x_hat, sum), worker <= 4x the model
#   faults/step minor page faults per step: the worker's median over the
#               steps after the first (its summary's step_minor_faults); the
#               shard's whole-run faults beyond one per page of its peak RSS
#               (the first touch), per step. A step that hands its buffers
#               back to the kernel re-faults them every step, which costs
#               more than the step's work on some machines: read step times
#               beside these and beside the allocator the daemons report
#               (their malloc, PSERVER_MALLOC at configure time).
# and the median over the runs. The machine is shared: read medians.
#
#   tests/bench/large_model.sh [--results] [BUILD_DIR]   # PARAMS STEPS REPEAT
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RESULTS=0
if [[ "${1:-}" == "--results" ]]; then RESULTS=1; shift; fi
BUILD="${1:-$ROOT/build}"
PARAMS="${PARAMS:-100000000}"
STEPS="${STEPS:-6}"
REPEAT="${REPEAT:-3}"
PY=/usr/bin/python3
for b in "$BUILD/server/pserver_server" "$BUILD/worker/pserver_worker"; do
  [[ -x "$b" ]] || { echo "large_model.sh: no $b; build first" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "large_model.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
DIR="$(mktemp -d /tmp/pserver-large.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT

run() {  # run NAME CODEC REP
  local name=$1 codec=$2 rep=$3 tag="$1.$3"
  /usr/bin/time -f "%M %R" -o "$DIR/$tag.server.rss" \
    "$BUILD/server/pserver_server" --num_workers=1 --optimizer=adam \
    --pull_codec="$codec" --listen=127.0.0.1:0 --metrics_listen= \
    --port_file="$DIR/$tag.port" 2>"$DIR/$tag.server.log" &
  local spid=$!
  for _ in $(seq 600); do [[ -s "$DIR/$tag.port" ]] && break; sleep 0.05; done
  [[ -s "$DIR/$tag.port" ]] || { cat "$DIR/$tag.server.log" >&2; exit 1; }
  /usr/bin/time -f "%M %R" -o "$DIR/$tag.worker.rss" \
    "$BUILD/worker/pserver_worker" --servers="127.0.0.1:$(cat "$DIR/$tag.port")" \
    --model=synthetic --synthetic_params="$PARAMS" --synthetic_tensors=8 \
    --steps="$STEPS" --push_codec="$codec" --warmup_codec="$codec" \
    --progress=lines --log_interval=1000 --rpc_timeout=600 --pull_timeout=600 \
    --metrics_listen= --summary_json="$DIR/$tag.json" >"$DIR/$tag.worker.log" 2>&1 \
    || { cat "$DIR/$tag.worker.log" >&2; exit 1; }
  kill -TERM "$(pgrep -f "port_file=$DIR/$tag.port" | while read -r p; do
    [[ "$(cat /proc/"$p"/comm 2>/dev/null)" == pserver_server ]] && echo "$p"; done)" \
    2>/dev/null || true
  wait "$spid" 2>/dev/null || true
}

echo "model: $PARAMS fp32 parameters = $(awk -v p="$PARAMS" 'BEGIN{printf "%.0f", p*4/1048576}') MiB; 1 shard, 1 worker on loopback; $REPEAT runs of $STEPS steps each"
for rep in $(seq "$REPEAT"); do
  for codec in fp32 onebit; do run "$codec" "$codec" "$rep"; done
done

"$PY" - "$DIR" "$PARAMS" "$REPEAT" "$RESULTS" "$ROOT" <<'EOF'
import json, statistics, sys, os
d, params, repeat, results, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
model = params * 4
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
            if l.startswith("model name")), "?")
rows, lines = {}, ["machine: %s, %d cores, kernel %s" % (cpu, os.cpu_count(), os.uname().release)]
for codec in ("fp32", "onebit"):
    for rep in range(1, repeat + 1):
        tag = f"{codec}.{rep}"
        s = json.load(open(f"{d}/{tag}.json"))
        skb, sflt = map(int, open(f"{d}/{tag}.server.rss").read().split()[-2:])
        wkb = int(open(f"{d}/{tag}.worker.rss").read().split()[-2])
        srss, wrss = skb * 1024, wkb * 1024
        steps = s["step_seconds"]
        wflt = s.get("step_minor_faults", [])
        malloc = s.get("malloc", "?")
        push_t = s["encode_seconds"] + s["push_seconds"]
        rows.setdefault(codec, []).append(dict(
            step=statistics.median(steps[1:]) if len(steps) > 1 else steps[0],
            push_fp32=s["push_fp32_bytes"] / push_t / 1e9,
            push_wire=s["push_bytes"] / push_t / 1e9,
            pull_fp32=s["pull_fp32_bytes"] / s["pull_seconds"] / 1e9,
            pull_wire=s["pull_bytes"] / s["pull_seconds"] / 1e9,
            server=srss / model, worker=wrss / model,
            wfaults=statistics.median(wflt[1:]) if len(wflt) > 1 else float("nan"),
            sfaults=max(0, sflt - skb // 4) / len(steps)))
fmt = "%-7s %-6s %8s %22s %22s %12s %12s %19s"
lines.append("daemons' malloc: %s (the worker's summary)" % malloc)
lines.append(fmt % ("codec", "run", "s/step", "push GB/s fp32 (wire)",
                    "pull GB/s fp32 (wire)", "shard RSS", "worker RSS",
                    "faults/step w, s"))
for codec, rs in rows.items():
    for i, r in enumerate(rs + [None]):
        if r is None:
            r = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
            label = "median"
        else:
            label = str(i + 1)
        lines.append(fmt % (codec, label, "%.3f" % r["step"],
                            "%.2f (%.3f)" % (r["push_fp32"], r["push_wire"]),
                            "%.2f (%.3f)" % (r["pull_fp32"], r["pull_wire"]),
                            "%.1fx" % r["server"], "%.1fx" % r["worker"],
                            "%.0f, %.0f" % (r["wfaults"], r["sfaults"])))
med = {c: statistics.median(x["step"] for x in rs) for c, rs in rows.items()}
lines.append("")
lines.append("targets (issue 10, 100M): fp32 <= 1.2 s/step, 1-bit <= 0.3 s/step, "
             "shard <= 5x, worker <= 4x the model")
lines.append("fp32 / 1-bit step time (medians, this run): %.2fx" % (med["fp32"] / med["onebit"]))
# The model-sized fp32 arrays each process holds by design, and what the
# peak RSS has beyond them (messages in flight, buffers, the binary).
# Shard: x, m, v and the round's sum; with 1-bit pulls also x_hat, the
# workers' replica. Worker: the replica and the gradient; with fp32 pulls
# the staging copy (each fp32 pull, a snapshot, is staged there and
# committed whole; a 1-bit delta is kept encoded and applied in place at
# the commit, worker/replica.h), with 1-bit pushes the error-feedback
# residual.
arrays = {"fp32": (4, 3), "onebit": (5, 3)}
for codec, rs in rows.items():
    sa, wa = arrays[codec]
    srv = statistics.median(x["server"] for x in rs)
    wrk = statistics.median(x["worker"] for x in rs)
    lines.append("%s: shard %d arrays + %.0f MiB, worker %d arrays + %.0f MiB (peak RSS "
                 "beyond the model-sized arrays, medians)" %
                 (codec, sa, (srv - sa) * model / 2**20, wa, (wrk - wa) * model / 2**20))
text = "\n".join(lines)
print(text)
if results:
    with open(os.path.join(root, "tests/bench/results/large_model.txt"), "w") as f:
        f.write(f"model: {params} fp32 parameters, 1 shard, 1 worker, loopback, {repeat} runs\n")
        f.write(text + "\n")
EOF
