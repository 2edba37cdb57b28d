#!/usr/bin/env bash
# Straggler benchmark (not a unit test): the reference workload (Fashion-MNIST
# MLP, 4 workers x batch 32, 2 shards, 1-bit Adam with 1-bit pushes and
# pulls) through the real local cluster, where every worker's step includes
# COMPUTE_MS of compute (a sleep: the 2-core machine has no spare cores to
# burn) and worker 0's STRAGGLER_MS, about twice as slow. Compares the
# rounds' consistency modes (docs/consistency.md):
#   bsp     every round waits for every worker (EPOCHS epochs)
#   ssp4    --consistency=ssp --max_staleness=4   (up to 2 x EPOCHS epochs)
#   async   --consistency=async                   (up to 2 x EPOCHS epochs)
# and prints, per mode (means over SEEDS): the fast workers' steps per
# second, the final accuracy, and the wall time until the first evaluation
# (every EVAL_EVERY steps, a quarter epoch by default) at or above the
# target accuracy: bsp's mean final accuracy minus 0.3 points (a bsp run
# that ends below it counts its whole run, which favours bsp). The speed-up
# is bsp's time to the target over the mode's, measured in the same
# invocation, of the means and of the medians over the seeds (one seed's
# time can be far off: the target lies where the accuracy curve is flat).
# Writes RESULTS/straggler.md and RESULTS/straggler.json.
#
#   tests/bench/straggler.sh                   # seeds 1 2 3, 2 epochs
#   SEEDS=1 MODES="bsp ssp4" tests/bench/straggler.sh
#   REPORT_ONLY=1 tests/bench/straggler.sh     # the report from RESULTS/runs
#   SERVER_EXTRA="--ssp_patience=0.2" MODES=ssp4 RESULTS=DIR ...  # tuning
#       (DIR/runs must hold bsp runs for the report)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RESULTS="${RESULTS:-$ROOT/results/straggler}"
SEEDS="${SEEDS:-1 2 3}"
EPOCHS="${EPOCHS:-2}"
MODES="${MODES:-bsp ssp4 async}"
COMPUTE_MS="${COMPUTE_MS:-30}"
STRAGGLER_MS="${STRAGGLER_MS:-65}"
EVAL_EVERY="${EVAL_EVERY:-117}"
PY=/usr/bin/python3
mkdir -p "$RESULTS/runs"

declare -A SERVER=(
  [bsp]="--consistency=bsp"
  [ssp1]="--consistency=ssp --max_staleness=1"
  [ssp4]="--consistency=ssp --max_staleness=4"
  [async]="--consistency=async"
)
RECIPE="--optimizer onebit_adam --push-codec onebit --pull-codec onebit --warmup-codec quantize --freeze-step 600"

for mode in $MODES; do
  [[ -n "${SERVER[$mode]:-}" ]] || { echo "straggler.sh: unknown mode '$mode'" >&2; exit 2; }
  epochs=$EPOCHS
  [[ "$mode" == bsp ]] || epochs=$((2 * EPOCHS))
  for seed in $SEEDS; do
    dir="$RESULTS/runs/$mode-seed$seed"
    if [[ "${REPORT_ONLY:-0}" == 1 ]]; then
      [[ -f "$dir/worker0.json" ]] ||
        { echo "straggler.sh: REPORT_ONLY: no $dir/worker0.json" >&2; exit 1; }
      continue
    fi
    rm -rf "$dir"
    echo "straggler.sh: $mode seed $seed ($epochs epochs) ..." >&2
    # shellcheck disable=SC2086
    METRICS_PORT=9400 WORKER_METRICS_PORT=9500 \
    SERVER_FLAGS="${SERVER[$mode]} --onebit_momentum=worker ${SERVER_EXTRA:-}" \
    WORKER_FLAGS="--bits=8 --compute_delay_ms=$COMPUTE_MS --eval_every_steps=$EVAL_EVERY" \
    WORKER0_FLAGS="--compute_delay_ms=$STRAGGLER_MS" \
      "$ROOT/deploy/local.sh" $RECIPE --epochs "$epochs" --seed "$seed" \
      --run-dir "$dir" --base-port 52151 </dev/null >"$dir.log" 2>&1 ||
      { echo "straggler.sh: run $mode seed $seed failed; see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
  done
done

"$PY" - "$RESULTS" "$MODES" "$SEEDS" "$COMPUTE_MS" "$STRAGGLER_MS" "$EPOCHS" "$EVAL_EVERY" <<'EOF'
import json, statistics, sys
results, modes, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
compute_ms, straggler_ms, epochs = sys.argv[4], sys.argv[5], sys.argv[6]
eval_every = sys.argv[7]

def load(mode, seed):
    runs = []
    for w in range(4):
        with open(f"{results}/runs/{mode}-seed{seed}/worker{w}.json") as f:
            runs.append(json.load(f))
    return runs

data = {m: [load(m, s) for s in seeds] for m in modes}
if "bsp" not in data:
    sys.exit("straggler.sh: the report needs the bsp runs (the baseline)")
target = statistics.mean(r[1]["test_accuracy"] for r in data["bsp"]) - 0.003

def time_to(run, whole_run_if_not):
    # The fast workers' (1..3) first evaluation at or above the target.
    times = []
    for w in run[1:]:
        t = next((e[1] for e in w["evaluations"] if e[2] >= target), None)
        if t is None and whole_run_if_not:
            t = w["evaluations"][-1][1]
        times.append(t)
    return None if None in times else statistics.mean(times)

rows, out = [], []
for m in modes:
    steps_per_s, acc, ttt, walls, share, stalls = [], [], [], [], [], []
    for run in data[m]:
        fast = run[1:]
        # The share of the shards' versions a fast worker pushed for (a
        # worker a round went on without skips the next one), and the
        # steps that took over 0.2 s (rounds stalled at the bound).
        share.append(statistics.mean(
            len(w["step_seconds"]) / w["steps"] for w in fast))
        stalls.append(statistics.mean(
            sum(t > 0.2 for t in w["step_seconds"]) for w in fast))
        steps_per_s.append(statistics.mean(
            len(w["step_seconds"]) / w["wall_seconds"] for w in fast))
        acc.append(statistics.mean(w["test_accuracy"] for w in fast))
        ttt.append(time_to(run, m == "bsp"))
        walls.append(statistics.mean(w["wall_seconds"] for w in fast))
    reached = [t for t in ttt if t is not None]
    every = len(reached) == len(ttt)
    rows.append((m, statistics.mean(steps_per_s), statistics.mean(acc) * 100,
                 statistics.mean(reached) if every else None,
                 statistics.median(reached) if every else None,
                 len(reached), len(ttt), statistics.mean(walls),
                 min(share) * 100, max(share) * 100, min(stalls), max(stalls)))
    out.append({"mode": m, "fast_steps_per_second": steps_per_s,
                "fast_pushed_share": share, "fast_steps_over_200ms": stalls,
                "final_accuracy": acc, "seconds_to_target": ttt,
                "wall_seconds": walls})
bsp_t = rows[0][3] if rows[0][0] == "bsp" else None
bsp_med = rows[0][4] if rows[0][0] == "bsp" else None
lines = [
    f"Target accuracy {target * 100:.2f}% (bsp's mean final accuracy over seeds "
    f"{' '.join(seeds)}, minus 0.3 points). Worker 0 computes {straggler_ms} ms "
    f"a step, the others {compute_ms} ms; bsp runs {epochs} epochs, the other "
    f"modes up to {2 * int(epochs)}; an evaluation every {eval_every} steps "
    "and after each epoch.",
    "",
    "| mode | fast workers' steps/s | final accuracy % (fast workers) | s to target (mean) | speed-up (means) | s to target (median) | speed-up (medians) | reached | wall s | versions pushed % (fast, per seed) | steps over 0.2 s (fast, per seed) |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
for m, sps, a, t, tm, n, k, wall, sh0, sh1, st0, st1 in rows:
    speed = f"{bsp_t / t:.2f}x" if (t and bsp_t) else "n/a"
    speed_med = f"{bsp_med / tm:.2f}x" if (tm and bsp_med) else "n/a"
    ts = f"{t:.1f}" if t is not None else "not reached"
    tms = f"{tm:.1f}" if tm is not None else "not reached"
    lines.append(f"| {m} | {sps:.1f} | {a:.2f} | {ts} | {speed} | {tms} | "
                 f"{speed_med} | {n}/{k} | {wall:.1f} | {sh0:.1f}..{sh1:.1f} | "
                 f"{st0:.0f}..{st1:.0f} |")
text = "\n".join(lines) + "\n"
with open(f"{results}/straggler.md", "w") as f:
    f.write(text)
with open(f"{results}/straggler.json", "w") as f:
    json.dump({"target_accuracy": target, "runs": out}, f, indent=1)
print(text)
EOF
