#!/usr/bin/env bash
# GPT script parity benchmark (not a unit test, issue 27): the same training
# script, python/examples/train_gpt.py (AdamW with weight-decay groups,
# LambdaLR warmup + cosine, clip_grad_norm_ 1.0, tied embeddings, a frozen
# parameter), run (a) in one process with torch.optim.AdamW on the global
# batch and (b) through `python3 -m pserver.launch --shards 2 --workers 2
# --optimizer adam --pull-codec fp32` with pserver.torch.DistributedOptimizer
# (fp32 pushes), each worker taking half of the same global batch. Prints
# each seed's final validation loss (nats per byte) for both, the relative
# difference, the means over the seeds and met/MISSED against the target:
# the pserver mean within 0.5% of the reference mean. The pserver run clips
# each worker's gradient (per-worker clipping), the reference the mean
# gradient; tests/bench/gpt_clip_sim.py measures that part alone.
#
#   tests/bench/gpt_script_parity.sh                  # seeds 1 2 3
#   SEEDS=1 STEPS=50 tests/bench/gpt_script_parity.sh
#   RUNS=ref tests/bench/gpt_script_parity.sh         # the reference only
#   STEPS=2000 RUNS="ref ps ps_mean" NAME=gpt_clip_scope \
#     tests/bench/gpt_script_parity.sh   # both clipping options (issue 47)
#
# Runs: ref (torch.optim.AdamW, one process, clips the mean), ps (pserver,
# clip_grad_norm_ in the script: per-worker), ps_mean (pserver,
# --clip-scope mean: the shards clip the round's mean, as DDP).
#
# Variables: SEEDS ("1 2 3"), STEPS (300), BATCH (global, 16), RUNS ("ref ps"),
# NAME (gpt_script_parity: the results file's name),
# TRAIN_ARGS (more train_gpt.py options for both runs, e.g. "--size small"),
# REPORT_ONLY (1: no runs, the report remade from the run records in WORK,
# with COMMIT as the runs' commit),
# BUILD (./build), OUT (tests/bench/results: gpt_script_parity.json there),
# WORK (each run's logs and JSON; default a new /tmp folder). Threads: one
# per process (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS), OpenBLAS's Haswell
# kernel unless OPENBLAS_CORETYPE says otherwise (as fidelity.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
OUT="${OUT:-$ROOT/tests/bench/results}"
SEEDS="${SEEDS:-1 2 3}"
STEPS="${STEPS:-300}"
BATCH="${BATCH:-16}"
RUNS="${RUNS:-ref ps}"
NAME="${NAME:-gpt_script_parity}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
WORK="${WORK:-$(mktemp -d /tmp/pserver-gpt-parity.XXXXXX)}"
SCRIPT="$ROOT/python/examples/train_gpt.py"
die() { echo "gpt_script_parity.sh: $*" >&2; exit 2; }
case "${1:-}" in
  -h|--help) sed -n '2,33p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "unknown argument '$1'; the settings are variables (see --help)" ;;
esac
REPORT_ONLY="${REPORT_ONLY:-0}"
if [[ $REPORT_ONLY != 1 && " $RUNS " == *" ps"* ]]; then
  [[ -x "$BUILD/server/pserver_server" ]] ||
    die "no $BUILD/server/pserver_server: build first (tests/run.sh)"
  ls "$BUILD"/python/pserver/_native*.so >/dev/null 2>&1 ||
    die "no Python extension in $BUILD/python/pserver: build first (tests/run.sh)"
fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
mkdir -p "$WORK" "$OUT"
echo "gpt_script_parity: seeds $SEEDS, $STEPS steps, global batch $BATCH," \
     "runs: $RUNS, logs in $WORK"

# The shards' defaults for --optimizer adam are torch.optim.AdamW's (bias
# correction on, betas 0.9 and 0.999, eps 1e-8), which train_gpt.py passes
# to DistributedOptimizer; it refuses betas or eps other than the shards'.
for seed in $SEEDS; do
  [[ $REPORT_ONLY == 1 ]] && break
  # shellcheck disable=SC2086
  common=(--seed "$seed" --steps "$STEPS" --batch "$BATCH" $TRAIN_ARGS)
  if [[ " $RUNS " == *" ref "* ]]; then
    start=$SECONDS
    /usr/bin/python3 "$SCRIPT" "${common[@]}" --json "$WORK/ref_$seed.json" \
      > "$WORK/ref_$seed.log" 2>&1 ||
      { tail -20 "$WORK/ref_$seed.log" >&2; die "reference seed $seed failed"; }
    echo "seed $seed ref: $(grep final_val_loss "$WORK/ref_$seed.log")" \
         "($((SECONDS - start)) s)"
  fi
  for run in ps ps_mean; do
    [[ " $RUNS " == *" $run "* ]] || continue
    scope=worker
    [[ $run == ps_mean ]] && scope=mean
    start=$SECONDS
    PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 \
      -m pserver.launch --shards 2 --workers 2 \
      --server-bin "$BUILD/server/pserver_server" --run-dir "$WORK/${run}_$seed" \
      --optimizer adam --pull-codec fp32 \
      "$SCRIPT" --pserver "${common[@]}" --clip-scope "$scope" \
      --json "$WORK/${run}_$seed.json" > "$WORK/${run}_$seed.log" 2>&1 ||
      { tail -20 "$WORK/${run}_$seed.log" >&2; die "$run seed $seed failed"; }
    echo "seed $seed $run: $(grep final_val_loss "$WORK/${run}_$seed.log")" \
         "($((SECONDS - start)) s)"
  done
done

/usr/bin/python3 - "$WORK" "$OUT/$NAME.json" "$SEEDS" "$RUNS" \
    "${COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
    <<'EOF'
import json, os, statistics, sys
work, out, seeds, runs, commit = sys.argv[1:]
seeds = [int(s) for s in seeds.split()]
runs = runs.split()
TARGET = 0.005
res = {r: {s: json.load(open(os.path.join(work, f"{r}_{s}.json")))
           for s in seeds} for r in runs}
loss = {r: [res[r][s]["final_val_loss"] for s in seeds] for r in runs}
mean = {r: statistics.mean(loss[r]) for r in runs}
sps = {r: statistics.mean(res[r][s]["seconds_per_step"] for s in seeds)
       for r in runs}
compared = [r for r in runs if r != "ref"] if "ref" in runs else []
print(f"{'seed':>6} " + " ".join(f"{r:>10}" for r in runs)
      + "".join(f"  {r + '/ref-1':>12}" for r in compared))
rel = {r: [] for r in compared}
for i, s in enumerate(seeds):
    row = f"{s:>6} " + " ".join(f"{loss[r][i]:10.4f}" for r in runs)
    for r in compared:
        rel[r].append(loss[r][i] / loss["ref"][i] - 1)
        row += f"  {100 * rel[r][-1]:+11.3f}%"
    print(row)
print(f"{'mean':>6} " + " ".join(f"{mean[r]:10.4f}" for r in runs))
print("s/step " + " ".join(f"{sps[r]:10.3f}" for r in runs))
report = {"benchmark": "tests/bench/gpt_script_parity.sh", "commit": commit,
          "settings": res[runs[0]][seeds[0]]["settings"],
          "parameters": res[runs[0]][seeds[0]]["parameters"],
          "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
          "seeds": seeds, "final_val_loss": loss, "mean": mean,
          "seconds_per_step": sps,
          "val_curve": {r: {s: res[r][s]["val_curve"] for s in seeds}
                        for r in runs},
          "train_curve": {r: {s: res[r][s]["train_curve"] for s in seeds}
                          for r in runs}}
report["settings"].pop("pserver", None)
report["settings"].pop("json", None)
report["settings"].pop("seed", None)
for r in compared:
    d = mean[r] / mean["ref"] - 1
    met = abs(d) <= TARGET
    print(f"{r} vs torch.optim.AdamW, {len(seeds)}-seed means: "
          f"{100 * d:+.3f}% (target within {100 * TARGET:.1f}%): "
          f"{'met' if met else 'MISSED'}")
    key = "" if r == "ps" else f"_{r}"
    report.update({f"relative_difference_per_seed{key}": rel[r],
                   f"relative_difference_of_means{key}": d,
                   "target": TARGET, f"met{key}": met})
with open(out, "w") as f:
    json.dump(report, f, indent=1)
print(f"wrote {out}")
EOF
