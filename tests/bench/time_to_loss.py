#!/usr/bin/python3
"""The plan, the per-run results and the report of tests/bench/time_to_loss.sh
(issue 29 section 1): wall-clock seconds to a target validation loss of the
language model of the LM fidelity benchmark, every host on its own shaped
link. The shell script owns the namespaces and the processes; this file owns
what each run is and what the runs mean.

  plan     writes WORK/<rate>/<row>/<seed>/spec.json, shard.args and
           worker.args (one argument a line) for every run not done yet and
           prints "SEED RATE ROW KIND LAYOUT DIR" for each; a run whose result.json
           holds the same spec is reused, one of another spec is reported
           (stderr) and left alone.
  collect  DIR: result.json from rank 0's train.json, the tc counters and
           the processes' /usr/bin/time files.
  report   the table, the verdicts and one SVG per rate from the results in
           WORK whose spec is the current one (OUT/time_to_loss.md, .json,
           time_to_loss_<rate>.svg).

Rows (ROWS below, editable; the pserver rows are lm_fidelity.py's, the
local-step ones with the long lease): DDP over gloo with the fp32, fp16 and
PowerSGD hooks (train_gpt.py --ddp), pserver fp32, 1-bit Adam (the lm-onebit
recipe), TopK (lm-topk) and DiLoCo with 16 local steps and 8-bit or 1-bit
pseudo-gradients; 1-bit and TopK again with a shard beside each worker
(the *_colocated rows). Every run: lm_fidelity.py's RECIPE, 4 workers (2
shard hosts for pserver, or a shard on each worker's host), seed = the run's index, stopped at the first evaluation at or
below the target (adamw's mean final loss in lm_fidelity.json + 2%) or past
CAP seconds of training.
"""

import argparse
import json
import math
import os
import pathlib
import shlex
import statistics
import sys
from xml.sax.saxutils import escape

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import lm_fidelity as lmf  # noqa: E402
import network_report  # noqa: E402

WORKERS = 4
SHARDS = 2
# The local-step rows: a worker is silent towards the shards for a round,
# longer than the default lease when rank 0 evaluates on a busy machine.
LONG_LEASE = f" {lmf.LONG_LEASE}"
ROWS = {
    "ddp_fp32": {"kind": "ddp", "hook": "fp32"},
    "ddp_fp16": {"kind": "ddp", "hook": "fp16"},
    "ddp_powersgd": {"kind": "ddp", "hook": "powersgd"},
    "ps_fp32": lmf.ROWS["ps_fp32"],
    "ps_onebit": lmf.ROWS["ps_onebit"],
    "ps_topk": lmf.ROWS["ps_topk"],
    "diloco_h16_q8": dict(lmf.ROWS["diloco_h16_q8"],
                          shard=lmf.ROWS["diloco_h16_q8"]["shard"] + LONG_LEASE),
    "diloco_h16_onebit": dict(
        lmf.ROWS["diloco_h16_onebit"],
        shard=lmf.ROWS["diloco_h16_onebit"]["shard"] + LONG_LEASE),
    "diloco_h16_q2_wm": lmf.ROWS["diloco_h16_q2_wm"],  # has the long lease
    "diloco_h16_q2_b085": lmf.ROWS["diloco_h16_q2_b085"],  # --recipe lm-local
    # Fewer local steps per round: at 100 Mbit/s H = 16 leaves the link
    # idle most of a step (its wire time is a fifth of the CPU's), so a
    # round every 4 steps costs little time. DiLoCo's outer Nesterov (lr
    # 0.7, momentum 0.9) is made for long rounds: with 4 steps
    # (diloco_h4_q8, not among the default runs) it had a validation loss
    # of 2.53 at step 1600 (seed 1, stopped there), so localsgd_h4_q8
    # averages the workers' models (outer SGD at lr 1, no momentum: local
    # SGD).
    "diloco_h4_q8": dict(lmf.ROWS["diloco_h16_q8"],
                         shard=lmf.ROWS["diloco_h16_q8"]["shard"] + LONG_LEASE,
                         script="--local-steps 4 --push-codec quantize --bits 8"),
    "localsgd_h4_q8": {"kind": "ps",
                       "shard": "--optimizer sgd --momentum=0 --lr 1.0 "
                                f"--weight_decay=0 {lmf.LONG_LEASE} "
                                "--pull-codec quantize --pull_bits=8",
                       "script": "--local-steps 4 --push-codec quantize --bits 8"},
    # BytePS's layout: a shard beside each worker, on the worker's host (4
    # shards, no shard hosts), so every host's link carries an equal share.
    "ps_onebit_colocated": dict(lmf.ROWS["ps_onebit"], layout="colocated"),
    "ps_topk_colocated": dict(lmf.ROWS["ps_topk"], layout="colocated"),
}
TARGET_MARGIN = 0.02  # the target: adamw's mean final loss x (1 + this)
BASELINE = "ddp_fp32"
# Issue 29's targets: (rate in bit/s, rows, at least this much sooner than
# BASELINE); a list of rows is met by its best row.
GOALS = [(100e6, ["ps_onebit", "ps_onebit_colocated"], 5),
         (100e6, ["diloco_h16_q8", "diloco_h16_onebit", "diloco_h16_q2_wm",
                  "diloco_h16_q2_b085", "localsgd_h4_q8"], 10),
         (1e9, ["ps_onebit", "ps_onebit_colocated"], 2)]
# Machines of this kind have differed by about 1.5x in compute from one day
# to the next. Runs of one row do the same work per step, so when their
# workers' CPU seconds per step (worker_speed) differ by more than this
# factor, the runs were made on machines of different speed and the row's
# median mixes them: the report marks such rows.
MACHINE_SPREAD = 1.2
# Where each layout puts the shards: (hosts, shards).
LAYOUTS = {"dedicated": ("2 shard hosts", SHARDS),
           "colocated": ("one beside each worker, on its host", WORKERS)}


# ---------------------------------------------------------------------------
# What each run is.

def reference_target(args):
    """(target, what it is): --target, else adamw's mean in --reference
    plus TARGET_MARGIN."""
    if args.target:
        return args.target, f"{args.target} (TARGET, given: a smoke test)"
    try:
        doc = json.loads(pathlib.Path(args.reference).read_text())
        adamw = next(r for r in doc["rows"] if r["row"] == "adamw")
    except (OSError, ValueError, KeyError, StopIteration) as e:
        sys.exit(f"time_to_loss: no adamw row in {args.reference} "
                 f"({type(e).__name__}: {e}); run tests/bench/lm_fidelity.sh "
                 "--results first, or give TARGET")
    mean = adamw["mean"]
    target = round(mean * (1 + TARGET_MARGIN), 6)
    return target, (f"{target:.4f} = adamw's mean final validation loss "
                    f"{mean:.4f} ({len(adamw['values'])} seeds, "
                    f"{shown(args.reference)}) + "
                    f"{100 * TARGET_MARGIN:g}%")


def common(args):
    c = dict(lmf.RECIPE, eval_every=args.eval_every)
    if args.steps:
        c["steps"] = args.steps
    return c


def spec(args, row, rate, seed, target):
    """Everything that makes a run what it is: a result is reused only
    when its spec is this one."""
    ns = argparse.Namespace(rows=ROWS, **common(args))
    rec = lmf.recipe(row, ns)
    rec["workers"] = WORKERS
    if "layout" in ROWS[row]:  # absent: dedicated (the runs made before)
        rec["layout"] = ROWS[row]["layout"]
        rec["shards"] = LAYOUTS[rec["layout"]][1]
    name, bps, burst = rate
    s = {"row": row, "rate": name, "rate_bps": bps, "burst": burst,
         "tbf_latency": args.tbf_latency, "seed": seed, "target": target,
         "cap_seconds": args.cap, "recipe": rec}
    if rec["kind"] == "ps":
        from pserver import launch
        # The launcher's spelling of the shard flags (--name=value), and its
        # defaults for what it does not set itself.
        s["server_flags"] = ["--metrics_listen=", "--drain_seconds=0",
                             *launch.parse_args([*rec["shard_flags"],
                                                 str(lmf.SCRIPT)])
                             ["server_flags"]]
    mode = (["--pserver"] if rec["kind"] == "ps" else ["--ddp", rec["hook"]])
    s["worker_args"] = [str(lmf.SCRIPT), *mode,
                        *lmf.script_flags(rec["common"]), "--seed", str(seed),
                        "--stop-at-loss", str(target),
                        "--max-seconds", str(args.cap),
                        *rec.get("script_flags", [])]
    return s


def load_result(rd):
    try:
        r = json.loads((rd / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return r if "spec" in r and "val_curve" in r else None


def runs(args):
    """(seed, rate triple, row, folder) in the order they run: every row at
    every rate once, then again for the next seed."""
    for seed in range(1, args.repeats + 1):
        for rate in args.rates:
            for row in args.runs:
                yield seed, rate, row, args.work / rate[0] / row / str(seed)


def plan(args):
    target, what = reference_target(args)
    print(f"time_to_loss: target {what}", file=sys.stderr)
    stale = 0
    for seed, rate, row, rd in runs(args):
        s = spec(args, row, rate, seed, target)
        r = load_result(rd)
        if r is not None and r["spec"] == s:
            print(f"time_to_loss: {rate[0]} {row} seed {seed}: reusing "
                  f"{rd}/result.json", file=sys.stderr)
            continue
        if r is not None:
            stale += 1
            print(f"time_to_loss: {rate[0]} {row} seed {seed}: {rd}/"
                  "result.json is a run of other settings ("
                  f"{differences(r['spec'], s)}); delete it or use another "
                  "WORK", file=sys.stderr)
            continue
        rd.mkdir(parents=True, exist_ok=True)
        (rd / "spec.json").write_text(json.dumps(s, indent=1))
        (rd / "shard.args").write_text("".join(
            f + "\n" for f in s.get("server_flags", [])))
        (rd / "worker.args").write_text("".join(
            f + "\n" for f in s["worker_args"]))
        (rd / "command").write_text(shlex.join(s["worker_args"]) + "\n")
        print(seed, rate[0], row, s["recipe"]["kind"],
              s["recipe"].get("layout", "dedicated"), rd)
    if stale:
        print(f"time_to_loss: {stale} run(s) of other settings left alone",
              file=sys.stderr)


def differences(there, here):
    def flat(d, pre=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{pre}{k}."))
            else:
                out[pre + k] = v
        return out
    a, b = flat(there), flat(here)
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    # The command lines follow from the rest: named only when alone.
    derived = ("worker_args", "server_flags")
    keys = [k for k in keys if k not in derived] or keys
    return "; ".join(f"{k}: {a.get(k)} there, {b.get(k)} here" for k in keys)


# ---------------------------------------------------------------------------
# One run's result.

def read_time(path):
    """/usr/bin/time -f '%e %U %S': (elapsed, user, system) seconds; its
    last line (a line before it says when a signal ended the process)."""
    lines = path.read_text().split("\n")
    elapsed, user, system = (float(x) for x in
                             [ln for ln in lines if ln.strip()][-1].split())
    return elapsed, user, system


def collect(args):
    rd = pathlib.Path(args.dir)
    s = json.loads((rd / "spec.json").read_text())
    t = json.loads((rd / "train.json").read_text())
    links = {h: {"in": i, "out": o}
             for h, (i, o) in network_report.tc_delta(str(rd)).items()}
    host, way = max(((h, w) for h in links for w in ("in", "out")),
                    key=lambda hw: links[hw[0]][hw[1]])
    steps = t["steps_done"]
    cpu = {}
    for f in sorted(rd.glob("cpu.*")):
        elapsed, user, system = read_time(f)
        cpu[f.name[4:]] = {"elapsed": elapsed, "user": user, "system": system,
                           "per_step": (user + system) / steps}
    r = {"spec": s, "environment": lmf.environment(),
         "reached": t["reached"], "stopped": t["stopped"],
         "time_to_target": t["reached_train_seconds"],
         "train_seconds": t["train_seconds"], "steps_done": steps,
         "step_seconds": t["train_seconds"] / steps,
         "final_val_loss": t["final_val_loss"], "val_curve": t["val_curve"],
         "link_bytes": links,
         "busiest_link": {"host": host, "way": way,
                          "bytes": links[host][way]},
         "cpu": cpu, "client_stats": t.get("client_stats", {})}
    tmp = rd / "result.json.tmp"
    tmp.write_text(json.dumps(r, indent=1))
    os.replace(tmp, rd / "result.json")  # complete or absent
    a = arrival(r)
    print(f"{s['rate']} {s['row']} seed {s['seed']}: {describe(a, s)}; "
          f"step {r['step_seconds']:.3f} s, busiest link {host} {way} "
          f"{links[host][way] / 1e6:.1f} MB, rank 0 CPU "
          f"{cpu.get('w0', {}).get('per_step', math.nan):.3f} s/step")


# ---------------------------------------------------------------------------
# The report.

def arrival(r):
    """(seconds, how): 'reached' at seconds of training; 'capped': stopped
    at the cap first, so later than seconds; 'never': every step done
    without reaching."""
    if r["reached"]:
        return r["time_to_target"], "reached"
    if r["stopped"] == "max_seconds":
        return r["train_seconds"], "capped"
    return r["train_seconds"], "never"


ORDER = {"reached": 0, "capped": 1, "never": 2}


def median_arrival(arrivals):
    """The median, a run that did not reach counting as later than every
    run that did: (seconds, how) as arrival()'s, a bound when not
    'reached'."""
    s = sorted(arrivals, key=lambda a: (ORDER[a[1]], a[0]))
    n = len(s)
    if n % 2:
        return s[n // 2]
    a, b = s[n // 2 - 1], s[n // 2]
    return (a[0] + b[0]) / 2, b[1]


def describe(a, s=None, short=False):
    seconds, how = a
    if how == "reached":
        return f"{seconds:.0f} s" if short else f"reached in {seconds:.0f} s"
    if how == "capped":
        cap = f" {s['cap_seconds']:g} s" if s else ""
        return (f"> {seconds:.0f} s (cap)" if short else
                f"not reached in{cap} (stopped at {seconds:.0f} s)")
    return "never" if short else f"not reached in {seconds:.0f} s (all steps)"


def speedup(base, row):
    """How many times sooner `row` reaches the target than `base`, from
    their median arrivals: (value, relation), relation one of '=', '>=',
    '<=', 'inf' (base never reaches), 'zero' (row never does) or None
    (unknown)."""
    (b, kb), (r, kr) = base, row
    if kr == "never":
        return (0.0, "zero") if kb != "never" else (None, None)
    if kr == "reached":
        if kb == "never":
            return math.inf, "inf"
        return b / r, "=" if kb == "reached" else ">="
    return (b / r, "<=") if kb == "reached" else (None, None)


def show_speedup(x):
    v, rel = x
    if rel in ("=", ">=", "<="):
        return f"{'' if rel == '=' else rel + ' '}{v:.1f}x"
    return {"inf": f"inf ({BASELINE} never)", "zero": "0 (never)"}.get(
        rel, "-")


def verdict(x, goal):
    v, rel = x
    if rel in ("=", ">="):
        return "met" if v >= goal else ("MISSED" if rel == "=" else
                                         "not decided")
    if rel == "<=":
        return "MISSED" if v < goal else "not decided"
    return {"inf": "met", "zero": "MISSED"}.get(rel, "not decided")


def step_costs(r):
    """(wire, cpu): what a step of r costs the link and the cores, seconds.
    Wire: the busiest direction of the busiest host link over the run at
    the link's rate / steps. CPU: every process's CPU seconds per step /
    the cores, rank 0 counted as the median other worker (its evaluations
    are not training time). Both count start-up (a few CPU seconds per
    process, the model's first install on the wire) spread over the steps,
    so each can come out slightly above a step that it bounds: the step is
    bound by the one it nears."""
    steps = r["steps_done"]
    rate = r["spec"]["rate_bps"] / 8
    wire = max(max(v["in"], v["out"]) for v in r["link_bytes"].values())
    per = {p: c["per_step"] for p, c in r["cpu"].items()}
    speed = worker_speed(r)
    if "w0" in per and speed is not None:
        per["w0"] = speed
    cores = r["environment"].get("cores") or 1
    return (wire / steps / rate,
            max(sum(per.values()) / cores, max(per.values(), default=0.0)))


def worker_speed(r):
    """The median CPU seconds per step of r's workers other than rank 0
    (whose evaluations add to its own): the same for every run of a row on
    one machine, larger on a slower one. None without such workers."""
    others = [c["per_step"] for p, c in r["cpu"].items()
              if p.startswith("w") and p != "w0"]
    return statistics.median(others) if others else None


def machine_spread(rs):
    """(slowest / fastest worker_speed, fastest, slowest) over the runs rs;
    (1.0, x, x) for a single run."""
    speeds = [s for s in map(worker_speed, rs) if s]
    if not speeds:
        return (1.0, None, None)
    return (max(speeds) / min(speeds), min(speeds), max(speeds))


def summarise(results):
    """{rate: [row dict]} in the order of the results."""
    by = {}
    for r in results:
        by.setdefault(r["spec"]["rate"], {}).setdefault(
            r["spec"]["row"], []).append(r)
    out = {}
    for rate, rows in by.items():
        out[rate] = []
        for name, rs in rows.items():
            rs.sort(key=lambda r: r["spec"]["seed"])
            cpu = lambda kind: [c["per_step"] for r in rs  # noqa: E731
                                for p, c in r["cpu"].items()
                                if p.startswith(kind)]
            costs = [step_costs(r) for r in rs]
            out[rate].append({
                "row": name, "kind": rs[0]["spec"]["recipe"]["kind"],
                "seeds": [r["spec"]["seed"] for r in rs],
                "arrivals": [arrival(r) for r in rs],
                "median": median_arrival([arrival(r) for r in rs]),
                "step_seconds": statistics.median(r["step_seconds"]
                                                  for r in rs),
                "busiest_mb": statistics.median(
                    r["busiest_link"]["bytes"] for r in rs) / 1e6,
                "cpu_shard": statistics.median(cpu("s")) if cpu("s") else None,
                "cpu_worker": statistics.median(cpu("w")),
                "cpu_rank0": statistics.median(cpu("w0")),
                "wire_s_per_step": statistics.median(c[0] for c in costs),
                "cpu_s_per_step": statistics.median(c[1] for c in costs),
                "final_val_loss": statistics.median(r["final_val_loss"]
                                                    for r in rs),
                "machine_spread": machine_spread(rs),
                "runs": rs})
        base = next((r for r in out[rate] if r["row"] == BASELINE), None)
        for r in out[rate]:
            r["speedup"] = (speedup(base["median"], r["median"]) if base
                            else (None, None))
    return out


def mixes_machines(row):
    return row["machine_spread"][0] > MACHINE_SPREAD


def verdicts(rate_bps, rows):
    """[(line, met, ratio)] for GOALS at this rate."""
    by = {r["row"]: r for r in rows}
    out = []
    for bps, names, goal in GOALS:
        if bps != rate_bps:
            continue
        label = " or ".join(names)
        present = [by[n] for n in names if n in by]
        if BASELINE not in by or not present:
            out.append((f"- {label}: at least {goal}x sooner than {BASELINE}"
                        ": not measured (no runs)", "not measured", None))
            continue
        each = [(r, verdict(r["speedup"], goal)) for r in present]
        best = next((e for e in each if e[1] == "met"),
                    next((e for e in each if e[1] == "not decided"), each[0]))
        detail = ", ".join(f"{r['row']} {show_speedup(r['speedup'])} "
                           f"({describe(r['median'], short=True)} against "
                           f"{describe(by[BASELINE]['median'], short=True)})"
                           for r, _ in each)
        mixed = [r["row"] for r in present + [by[BASELINE]]
                 if mixes_machines(r)]
        note = (f" (runs of {', '.join(mixed)} from machines of different "
                "speed, marked *)" if mixed else "")
        out.append((f"- {label}: at least {goal}x sooner than {BASELINE}: "
                    f"{best[1]}; {detail}{note}", best[1],
                    best[0]["speedup"][0]))
    return out


def markdown(summary, rates, meta, failures, curves):
    out = ["# Time to a target loss (tests/bench/time_to_loss.sh)", "",
           f"Target: validation loss {meta['target_text']}. Time: seconds of "
           "training of rank 0 (its evaluations left out) until an "
           f"evaluation (every {meta['common']['eval_every']} steps) at or "
           f"below the target; a run stopped at the cap of "
           f"{meta['cap']:g} s is \"> T s (cap)\" (T: its training seconds "
           "at the evaluation where it stopped), one that did all "
           f"{meta['common']['steps']} steps without reaching it \"never\". "
           "Medians over the runs (one that did not reach counts as later "
           "than every one that did); per run in brackets, by seed.", ""]
    if meta["smoke"]:
        out += [f"**Smoke test, not a measurement: {meta['smoke']}.**", ""]
    for name, bps, burst in rates:
        rows = summary.get(name)
        out.append(f"## {name} per host link (tbf both ways, burst {burst} B, "
                   f"latency {meta['tbf_latency']})")
        out.append("")
        if not rows:
            out += ["No complete runs.", ""]
            continue
        out += ["| row | time to target | per run | step s | wire s/step |"
                " CPU s/step / cores | busiest link MB | CPU s/step shard | CPU "
                f"s/step worker (rank 0) | sooner than {BASELINE} | final "
                "val loss |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        mixed = [r for r in rows if mixes_machines(r)]
        for r in rows:
            per = " / ".join(describe(a, short=True) for a in r["arrivals"])
            shard = ("-" if r["cpu_shard"] is None
                     else f"{r['cpu_shard']:.3f}")
            mark = " *" if r in mixed else ""
            out.append(
                f"| {r['row']}{mark} | {describe(r['median'], short=True)} | "
                f"[{per}] | {r['step_seconds']:.3f} | {r['wire_s_per_step']:.3f} | "
                f"{r['cpu_s_per_step']:.3f} | {r['busiest_mb']:.0f} | "
                f"{shard} | {r['cpu_worker']:.3f} ({r['cpu_rank0']:.3f}) | "
                f"{show_speedup(r['speedup'])} | {r['final_val_loss']:.4f} |")
        out.append("")
        if mixed:
            out += ["\\* Runs made on machines of different speed: their "
                    "workers' CPU seconds per step (the same work) differ by "
                    f"more than {MACHINE_SPREAD:g}x ("
                    + "; ".join(f"{r['row']} {r['machine_spread'][1]:.3f} to "
                                f"{r['machine_spread'][2]:.3f} s, "
                                f"{r['machine_spread'][0]:.2f}x"
                                for r in mixed)
                    + "), so the median mixes machines, and a ratio to a "
                    "row measured on another machine is not one machine's.",
                    ""]
        lines = verdicts(bps, rows)
        out += [line for line, _, _ in lines] + ([""] if lines else [])
    if curves["pairs"]:
        out += [f"Validation curves across rates: of the {curves['pairs']} "
                "rows and seeds run at more than one rate, "
                f"{curves['same']} have the same loss at every rate, to the "
                "last digit, at each evaluation all their runs made"
                + (f"; differing: {', '.join(curves['differ'])}."
                   if curves["differ"] else "."), ""]
    if failures:
        out += ["Missing or failed runs (not in the tables):"]
        out += [f"- {f}" for f in failures] + [""]
    out += settings_lines(summary, meta)
    return "\n".join(out) + "\n"


def settings_lines(summary, meta):
    c = meta["common"]
    layouts = "; ".join(f"{k}: {v[1]} shards, {v[0]}"
                        for k, v in LAYOUTS.items())
    out = [f"Runs: GPTConfig.{c['size']}(), {c['steps']} steps of a global "
           f"batch of {c['batch']} windows over {WORKERS} workers (one host "
           f"each; pserver {layouts}; the *_colocated rows are "
           "colocated, the others dedicated), the lm_fidelity recipe "
           f"(tests/bench/lm_fidelity.py RECIPE: lr {c['lr']}, warmup "
           f"{c['warmup']}, betas {c['beta1']} {c['beta2']}, clip "
           f"{c['clip']}), seed = the run's index. Step s: training seconds "
           "/ steps done (rank 0). Busiest link: the most bytes one host's "
           "tbf qdisc carried in one direction over the run (tc, all "
           "framing, start-up included). CPU s/step: user + system seconds "
           "of each process over its whole life (start-up and rank 0's "
           "evaluations included, /usr/bin/time) / steps done; shard and "
           "worker columns the median over processes and runs. What a step "
           "costs the link and the cores, medians over runs: wire s/step, "
           "the busiest direction of the busiest host link (tc bytes over "
           "the run) at the link's rate / steps; CPU s/step / cores, every "
           "process's CPU seconds per step (rank 0 counted as the median "
           "other worker: its evaluations are not training) / the cores. "
           "Both include start-up, so they can come out slightly above the "
           "step; a step near the CPU figure is CPU-bound on this machine, "
           "one near the wire figure bound by the link.", "",
           "| row | shard flags | train_gpt.py flags |", "|---|---|---|"]
    here = str(lmf.ROOT) + os.sep
    seen = {}
    for rows in summary.values():
        for r in rows:
            seen.setdefault(r["row"], r["runs"][0]["spec"])
    for name, s in seen.items():
        shard = " ".join(s.get("server_flags", [])).replace(here, "") or "-"
        script = " ".join(s["worker_args"][1:]).replace(here, "")
        out.append(f"| {name} | `{shard}` | `{script}` |")
    envs = [r["environment"] for rows in summary.values() for x in rows
            for r in x["runs"]]
    out += ["", lmf.machine_line(envs) + " The cores are shared by every "
            "process of a run."]
    return out


def svg(rate, rows, target):
    """Validation loss against training seconds (log scale), every run of
    every row (the median run drawn thick), the target as a dashed line.
    The legend goes bottom left, where no curve goes: a low loss early."""
    W, H, L, R, T, B = 760, 470, 80, 740, 20, 400
    pts = [(e[2], e[1]) for r in rows for x in r["runs"]
           for e in x["val_curve"] if e[2] > 0]
    if not pts:
        return None
    lx0 = math.log10(min(t for t, _ in pts) / 1.3)
    lx1 = math.log10(max(t for t, _ in pts) * 1.3)
    lo = min(min(v for _, v in pts), target)
    hi = max(v for _, v in pts)
    pad = (hi - lo) * 0.05 or 0.01
    lo, hi = lo - pad, hi + pad

    def X(t):
        return L + (math.log10(t) - lx0) / (lx1 - lx0) * (R - L)

    def Y(v):
        return B - (v - lo) / (hi - lo) * (B - T)
    s = lmf.svg_open(W, H + 10)
    for e in range(math.floor(lx0), math.ceil(lx1) + 1):
        for m in (1, 2, 5):
            t = m * 10.0 ** e
            if not lx0 <= math.log10(t) <= lx1:
                continue
            x = X(t)
            s.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{B}" '
                     f'stroke="{"#ddd" if m == 1 else "#f2f2f2"}"/>')
            s.append(f'<text x="{x:.1f}" y="{B + 18}" text-anchor="middle">'
                     f'{t:g}</text>')
    lmf.y_axis(s, lo, hi, Y, L, R, "validation loss, nats/byte", T, B)
    s.append(f'<text x="{(L + R) // 2}" y="{H - 20}" text-anchor="middle">'
             f'seconds of training at {escape(rate)} per host link (log '
             'scale; rank 0, evaluations left out)</text>')
    y = Y(target)
    s.append(f'<line x1="{L}" y1="{y:.1f}" x2="{R}" y2="{y:.1f}" '
             'stroke="black" stroke-dasharray="6 4"/>')
    s.append(f'<text x="{R - 6}" y="{y - 5:.1f}" text-anchor="end">target '
             f'{target:.4f}</text>')
    for i, r in enumerate(rows):
        mid = median_run(r)
        for x in r["runs"]:
            curve = [(e[2], e[1]) for e in x["val_curve"] if e[2] > 0]
            p = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in curve)
            width, opacity = (2, 1) if x is mid else (1, 0.45)
            s.append(f'<polyline points="{p}" fill="none" '
                     f'stroke="{lmf.color(i)}" stroke-width="{width}" '
                     f'stroke-opacity="{opacity}"/>')
            for t, v in curve:  # the evaluations
                s.append(f'<circle cx="{X(t):.1f}" cy="{Y(v):.1f}" '
                         f'r="{width + 0.5}" fill="{lmf.color(i)}" '
                         f'fill-opacity="{opacity}"/>')
    lx, ly = L + 14, B - 16 * len(rows) - 14
    s.append(f'<rect x="{lx - 8}" y="{ly - 4}" width="234" '
             f'height="{16 * len(rows) + 8}" fill="white" stroke="#ccc"/>')
    for i, r in enumerate(rows):
        y = ly + 16 * i + 8
        s.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 24}" y2="{y}" '
                 f'stroke="{lmf.color(i)}" stroke-width="2"/>')
        s.append(f'<text x="{lx + 30}" y="{y + 4}">{escape(r["row"])} '
                 f'({escape(describe(r["median"], short=True))})</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


def median_run(row):
    """The run whose arrival is the median one (the later of the middle two
    for an even count)."""
    order = sorted(row["runs"], key=lambda r: (ORDER[arrival(r)[1]],
                                               arrival(r)[0]))
    return order[len(order) // 2]


def shown(path):
    """A path as the report names it: relative to the repository when inside
    it, else absolute (a WORK under /tmp would read ../../tmp/...)."""
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(lmf.ROOT) if path.is_relative_to(lmf.ROOT)
               else path)


def curves_across_rates(results):
    """Whether the link changes the training: for each row and seed run at
    more than one rate, whether its runs' validation losses are equal at
    every step all of them evaluated. {"pairs": n, "same": m, "differ":
    ["row seed s", ...]}."""
    by_run = {}
    for r in results:
        by_run.setdefault((r["spec"]["row"], r["spec"]["seed"]), []).append(
            {e[0]: e[1] for e in r["val_curve"]})
    differ, pairs = [], 0
    for (row, seed), curves in sorted(by_run.items()):
        if len(curves) < 2:
            continue
        pairs += 1
        steps = set.intersection(*(set(c) for c in curves))
        if any(c[s] != curves[0][s] for c in curves[1:] for s in steps):
            differ.append(f"{row} seed {seed}")
    return {"pairs": pairs, "same": pairs - len(differ), "differ": differ}


def report(args):
    target, what = reference_target(args)
    results, failures = [], []
    for seed, rate, row, rd in runs(args):
        r = load_result(rd)
        if r is not None and r["spec"] == spec(args, row, rate, seed, target):
            results.append(r)
        else:
            failures.append(f"{rate[0]} {row} seed {seed}: "
                            + ("a run of other settings" if r else
                               "failed, see its logs" if (rd / "spec.json")
                               .exists() else "not run") + f" ({shown(rd)})")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(results)
    smoke = ", ".join(x for x in (
        f"STEPS={args.steps}" if args.steps else "",
        f"TARGET={args.target}" if args.target else "") if x)
    meta = {"target": target, "target_text": what, "cap": args.cap,
            "tbf_latency": args.tbf_latency, "common": common(args),
            "smoke": smoke}
    curves = curves_across_rates(results)
    md = markdown(summary, args.rates, meta, failures, curves)
    (out / "time_to_loss.md").write_text(md)
    doc = {"benchmark": "tests/bench/time_to_loss.sh", "target": target,
           "target_source": what, "cap_seconds": args.cap,
           "settings": meta["common"], "workers": WORKERS,
           "layouts": {k: {"shards": v[1], "where": v[0]}
                       for k, v in LAYOUTS.items()},
           "smoke_test": smoke or None,
           "goals": [{"rate_bps": b, "rows": n, "sooner": g}
                     for b, n, g in GOALS],
           "rates": {}, "curves_across_rates": curves,
           "failures": failures}
    written = []
    for name, bps, burst in args.rates:
        rows = summary.get(name, [])
        doc["rates"][name] = {
            "rate_bps": bps, "burst": burst,
            "verdicts": [{"line": line[2:], "verdict": v, "ratio": x}
                         for line, v, x in verdicts(bps, rows)],
            "rows": [{k: v for k, v in r.items() if k != "runs"}
                     for r in rows],
            "runs": [x for r in rows for x in r["runs"]]}
        picture = svg(name, rows, target) if rows else None
        if picture:
            (out / f"time_to_loss_{name}.svg").write_text(picture)
            written.append(f"time_to_loss_{name}.svg")
    (out / "time_to_loss.json").write_text(json.dumps(doc, indent=1))
    print(md)
    print(f"time_to_loss: wrote {out}/time_to_loss.md, time_to_loss.json"
          + "".join(f", {w}" for w in written), file=sys.stderr)
    return 1 if failures else 0


def restore(args):
    """Writes the runs of a report's JSON (time_to_loss.json) into WORK as
    the result.json files they were made from, where WORK has none: a new
    machine then adds rows or seeds to the committed table (a restored run
    is reused only when its spec is still the one planned)."""
    doc = json.loads(pathlib.Path(args.source).read_text())
    written = kept = 0
    for rate, entry in doc.get("rates", {}).items():
        for r in entry.get("runs", []):
            s = r["spec"]
            if s["rate"] != rate:
                raise SystemExit(f"time_to_loss.py restore: {args.source}: a run "
                                 f"of rate {s['rate']!r} under {rate!r}")
            rd = args.work / rate / s["row"] / str(int(s["seed"]))
            if lmf.restore_run(rd, r, load_result):
                written += 1
            else:
                kept += 1
    print(f"time_to_loss: restored {written} run(s) from {args.source} into "
          f"{args.work} ({kept} already there, kept)", file=sys.stderr)


# ---------------------------------------------------------------------------

def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="DIR's result.json")
    c.add_argument("--dir", required=True)
    r = sub.add_parser("restore", help="a report's runs into WORK")
    r.add_argument("--work", required=True, type=pathlib.Path)
    r.add_argument("--source", required=True)
    for name in ("plan", "report"):
        q = sub.add_parser(name)
        q.add_argument("--work", required=True, type=pathlib.Path)
        q.add_argument("--rates", required=True,
                       help="'NAME:BIT_PER_S:BURST ...', e.g. "
                       "'100mbit:100000000:65536'")
        q.add_argument("--runs", required=True, help="row names")
        q.add_argument("--repeats", type=int, required=True)
        q.add_argument("--cap", type=float, required=True)
        q.add_argument("--eval-every", type=int, required=True)
        q.add_argument("--tbf-latency", required=True)
        q.add_argument("--reference", required=True)
        q.add_argument("--steps", type=int, default=0,
                       help="smoke tests only: not the recipe's steps")
        q.add_argument("--target", type=float, default=0.0,
                       help="smoke tests only: not adamw + 2%%")
        if name == "report":
            q.add_argument("--out", required=True)
        else:
            q.add_argument("--allow-dirty", action="store_true",
                           help="plan runs from a tree with uncommitted "
                           "changes (refused otherwise; the table says so)")
    a = p.parse_args(argv)
    if a.command not in ("collect", "restore"):
        a.work = a.work.resolve()
        a.rates = [(n, float(b), int(u)) for n, b, u in
                   (x.split(":") for x in a.rates.split())]
        a.runs = a.runs.split()
        unknown = [r for r in a.runs if r not in ROWS]
        if unknown:
            p.error(f"unknown row(s) {' '.join(unknown)}; rows: "
                    f"{' '.join(ROWS)}")
    return a


def main():
    args = parse()
    if args.command == "plan":
        if args.steps == 0:  # smoke tests run whatever the tree holds
            lmf.provenance.require_clean(args.allow_dirty, "time_to_loss")
        plan(args)
    elif args.command == "collect":
        collect(args)
    elif args.command == "restore":
        restore(args)
    else:
        sys.exit(report(args))


if __name__ == "__main__":
    main()
