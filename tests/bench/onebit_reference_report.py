#!/usr/bin/python3
"""The table of tests/bench/onebit_reference.py runs (not a test).

Each row is one set of onebit_reference.py options run for several seeds,
with --json files of one seed or several each; this merges a row's files
(checking that they share every setting but the seeds) and writes OUT.json
(every seed's test accuracy, the row's settings, mean and sample standard
deviation) and OUT.md (the table).

  /usr/bin/python3 tests/bench/onebit_reference_report.py --out PREFIX \\
      [--note TEXT] 'NAME|LABEL|OPTIONS|GLOB' ...

NAME is the row's id, LABEL what it is, OPTIONS the onebit_reference.py
options it ran with (shown in the table), GLOB its --json files, e.g.
'exact|frozen variance, exact pushes and pulls|--push fp32 --pull fp32|DIR/exact-seed*.json'.
"""
import argparse
import glob
import json
import statistics
import sys


def row(spec):
    try:
        name, label, options, pattern = spec.split("|")
    except ValueError:
        sys.exit(f"onebit_reference_report.py: expected NAME|LABEL|OPTIONS|GLOB, got {spec!r}")
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"onebit_reference_report.py: no files match {pattern}")
    settings, runs = None, {}
    for path in files:
        with open(path) as f:
            data = json.load(f)
        s = {k: v for k, v in data["settings"].items() if k not in ("seeds", "json")}
        if settings is None:
            settings = s
        elif s != settings:
            sys.exit(f"onebit_reference_report.py: {path}: settings differ from "
                     f"{files[0]}'s: {sorted(set(s.items()) ^ set(settings.items()))}")
        for r in data["runs"]:
            if r["seed"] in runs and runs[r["seed"]] != r["test_accuracy"]:
                sys.exit(f"onebit_reference_report.py: {name} seed {r['seed']}: two results")
            runs[r["seed"]] = r["test_accuracy"]
    seeds = sorted(runs)
    accs = [100 * runs[s] for s in seeds]
    return {"name": name, "label": label, "options": options, "settings": settings,
            "seeds": seeds, "test_accuracy": [runs[s] for s in seeds],
            "mean": statistics.mean(accs),
            "std": statistics.stdev(accs) if len(accs) > 1 else 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.md")
    ap.add_argument("--note", default="", help="a line under the table")
    ap.add_argument("rows", nargs="+")
    args = ap.parse_args()
    rows = [row(spec) for spec in args.rows]
    with open(args.out + ".json", "w") as f:
        json.dump({"script": "tests/bench/onebit_reference.py", "note": args.note,
                   "rows": rows}, f, indent=1)
        f.write("\n")
    with open(args.out + ".md", "w") as f:
        f.write("# 1-bit Adam in a one-process model (tests/bench/onebit_reference.py)\n\n")
        f.write("| model run | options | seeds | test accuracy % (mean) | std | per seed |\n")
        f.write("|---|---|---|---|---|---|\n")
        for r in rows:
            seeds = f"{r['seeds'][0]}-{r['seeds'][-1]}" if r["seeds"] == list(
                range(r["seeds"][0], r["seeds"][-1] + 1)) else " ".join(map(str, r["seeds"]))
            per = " / ".join(f"{100 * a:.2f}" for a in r["test_accuracy"])
            opts = f"`{r['options']}`" if r["options"] else "(none)"
            f.write(f"| {r['label']} | {opts} | {seeds} | {r['mean']:.2f} | "
                    f"{r['std']:.2f} | {per} |\n")
        f.write("\nEach row: `/usr/bin/python3 tests/bench/onebit_reference.py --seeds S "
                "OPTIONS --json FILE`, one file per seed or several; std: sample standard "
                "deviation over seeds.\n")
        if args.note:
            f.write(args.note + "\n")
    print(open(args.out + ".md").read(), end="")


if __name__ == "__main__":
    main()
