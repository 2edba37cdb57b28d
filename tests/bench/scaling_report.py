"""Turns the raw data of tests/bench/scaling.sh into scaling.md, scaling.json
and scaling.svg (and the tables on stdout). Standard library only.

Per configuration (RUNS_DIR/<codec>_s<shards>_w<workers>/):
  w<k>.json                each worker's --summary_json (step_seconds)
  w<k>.time                /usr/bin/time of each worker: wall, user and
                           system seconds, peak RSS KiB, minor faults
  start.stat, end.stat     /proc/PID/stat of every shard and worker still
                           running, the machine's /proc/stat "cpu" line
                           and the time, at the window's two ends
  shard<s>.start.metrics, shard<s>.end.metrics
                           each shard's /metrics page at the two ends
  shard_rss                each shard's VmHWM at the end

The window: from the moment shard 0 had completed round R0 >= DROP to the
moment the last worker had written its summary; each shard's own rounds
R0_s+1..STEPS (shards finish a round when their pushes are in, not at once).

Figures per configuration:
  round s        the slowest worker's median step over steps DROP+1..STEPS
  shard CPU      utime + stime over the window / rounds, per shard (the
                 table shows the busiest shard)
  minor faults   the same for minflt
  MB in / out    Δ pserver_server_received_payload_bytes_total and
                 Δ pserver_server_sent_payload_bytes_total / rounds, per
                 shard (encoded payload; gRPC framing not counted)
  worker CPU     utime + stime over the window (or to its exit, from
                 /usr/bin/time, if it exited first) / (STEPS - min R0_s),
                 the mean over workers
  CPU use        all shards' and workers' CPU in the window / (cores x
                 window seconds); CPU-bound when it and the other load
                 reach CPU_BOUND (0.8)
  other load     the machine's busy time in the window (/proc/stat) less
                 ours, in cores: work of other programs
  model          the round from these CPU figures on this machine's cores
                 less the other load (model() below; docs/benchmarks.md)
  projected      the same model with a host for every process
Per shards x codec: least-squares slopes over the workers of the round time
(measured and projected) and of the busiest shard's CPU per round.
"""

import argparse
import json
import math
import os
import re
import statistics
import sys

CPU_BOUND = 0.8
TICK = os.sysconf("SC_CLK_TCK")
MB = 1e6


def read_stat(path):
    """{role: fields} from a sample file; a process's fields are those of
    /proc/PID/stat after the command name (index 0 = state)."""
    out = {}
    with open(path) as f:
        for line in f:
            role, _pid, rest = line.rstrip("\n").split(" ", 2)
            if role == "machine":
                out[role] = [int(x) for x in rest.split()[1:]]
            elif role == "time":
                out[role] = float(rest)
            else:
                out[role] = rest[rest.rindex(")") + 2:].split()
    return out


def proc_cpu(fields):
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def proc_minflt(fields):
    return int(fields[7])


def machine_busy(cpu):
    # user nice system idle iowait irq softirq steal (guest is in user)
    return (sum(cpu[:3]) + sum(cpu[5:8])) / TICK


def read_metrics(path):
    """{name: sum over its label sets} of a /metrics page."""
    out = {}
    pat = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
    with open(path) as f:
        for line in f:
            m = pat.match(line)
            if m:
                try:
                    out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
                except ValueError:
                    pass
    return out


def read_time(path):
    """/usr/bin/time -f '%e %U %S %M %R': the last line (a failed command
    adds one before it)."""
    with open(path) as f:
        e, u, s, m, r = f.read().split("\n")[-2].split()
    return {"wall": float(e), "cpu": float(u) + float(s), "rss_kib": int(m), "minflt": int(r)}


def config(rd, codec, ns, nw, a):
    start, end = read_stat(os.path.join(rd, "start.stat")), read_stat(os.path.join(rd, "end.stat"))
    window = end["time"] - start["time"]
    shards = []
    for s in range(ns):
        m0 = read_metrics(os.path.join(rd, f"shard{s}.start.metrics"))
        m1 = read_metrics(os.path.join(rd, f"shard{s}.end.metrics"))
        # Each shard's own rounds: shards complete a round when its pushes
        # are in, not at once, so they can be a round or two apart.
        r0, r1 = int(m0["pserver_server_step"]), int(m1["pserver_server_step"])
        rounds = r1 - r0
        if r1 != a.steps or rounds < 1:
            sys.exit(f"scaling_report.py: {rd}: shard {s} completed rounds {r0 + 1}..{r1}; "
                     f"expected at least one and the last {a.steps}")
        if m1.get("pserver_server_workers_dropped_total", 0) > 0:
            sys.exit(f"scaling_report.py: {rd}: shard {s} dropped a worker; the rounds are not "
                     "comparable (raise the lease)")

        def per_round(name):
            return (m1.get(name, 0.0) - m0.get(name, 0.0)) / rounds
        shards.append({
            "cpu_seconds_per_round": (proc_cpu(end[f"shard{s}"]) - proc_cpu(start[f"shard{s}"])) / rounds,
            "minor_faults_per_round": (proc_minflt(end[f"shard{s}"]) - proc_minflt(start[f"shard{s}"])) / rounds,
            "bytes_in_per_round": per_round("pserver_server_received_payload_bytes_total"),
            "bytes_out_per_round": per_round("pserver_server_sent_payload_bytes_total"),
            "aggregation_seconds_per_round": per_round("pserver_server_aggregation_duration_seconds_sum"),
            "optimizer_seconds_per_round": per_round("pserver_server_optimizer_duration_seconds_sum"),
            "pull_encode_seconds_per_round": per_round("pserver_server_pull_encode_duration_seconds_sum"),
            "threads": int(start[f"shard{s}"][17]),
            "window_first_round": r0, "window_rounds": rounds,
        })
    with open(os.path.join(rd, "shard_rss")) as f:
        for line, sh in zip(f, shards):
            sh["peak_rss_bytes"] = int(line.split()[2]) * 1024
    first_round = min(s["window_first_round"] for s in shards)
    worker_steps = a.steps - first_round
    workers, steps = [], []
    for w in range(nw):
        t = read_time(os.path.join(rd, f"w{w}.time"))
        with open(os.path.join(rd, f"w{w}.json")) as f:
            steps.append(json.load(f)["step_seconds"])
        # At the window's end if it still ran then, else at its exit.
        cpu1, minflt1 = ((proc_cpu(end[f"w{w}"]), proc_minflt(end[f"w{w}"])) if f"w{w}" in end
                         else (t["cpu"], t["minflt"]))
        workers.append({
            "cpu_seconds_per_step": (cpu1 - proc_cpu(start[f"w{w}"])) / worker_steps,
            "minor_faults_per_step": (minflt1 - proc_minflt(start[f"w{w}"])) / worker_steps,
            "cpu_seconds_whole_run": t["cpu"],
            "peak_rss_bytes": t["rss_kib"] * 1024,
            "threads": int(start[f"w{w}"][17]),
        })
    ours = (sum(s["cpu_seconds_per_round"] * s["window_rounds"] for s in shards) +
            sum(w["cpu_seconds_per_step"] for w in workers) * worker_steps)
    busy = machine_busy(end["machine"]) - machine_busy(start["machine"])
    r = {
        "codec": codec, "shards": ns, "workers": nw,
        "round_seconds": max(statistics.median(s[a.drop:]) for s in steps),
        "window_first_round": first_round, "window_seconds": window,
        "window_mean_round_seconds": window / worker_steps,
        "cpu_use": ours / (a.cores * window),
        "other_load_cores": max(0.0, busy - ours) / window,
        "shard_cpu_seconds_per_round": max(s["cpu_seconds_per_round"] for s in shards),
        "all_shards_cpu_seconds_per_round": sum(s["cpu_seconds_per_round"] for s in shards),
        "shard_minor_faults_per_round": max(s["minor_faults_per_round"] for s in shards),
        "shard_bytes_in_per_round": max(s["bytes_in_per_round"] for s in shards),
        "shard_bytes_out_per_round": max(s["bytes_out_per_round"] for s in shards),
        "worker_cpu_seconds_per_step": statistics.mean(w["cpu_seconds_per_step"] for w in workers),
        "worker_peak_rss_bytes": max(w["peak_rss_bytes"] for w in workers),
        "per_shard": shards, "per_worker": workers, "step_seconds": steps,
    }
    # Other programs' work takes cores from ours as much as our own does.
    r["cpu_bound"] = r["cpu_use"] + r["other_load_cores"] / a.cores >= CPU_BOUND
    r["model_round_seconds"] = model(r, max(0.5, a.cores - r["other_load_cores"]))
    r["measured_over_model"] = r["round_seconds"] / r["model_round_seconds"]
    r["projected_round_seconds"] = model(r, None)
    return r


def model(r, cores):
    """The round from the CPU figures (docs/benchmarks.md, "Scaling: workers
    and shards"): a synchronous round is a worker phase (compute, encode,
    push; decode the pull) and then a shard phase (decode and sum the
    pushes, step, encode the pulls), one after the other; each phase takes
    its longest process's CPU time, or its processes' CPU time spread over
    `cores` cores if that is longer (this machine's cores less what other
    programs used). cores=None: a host of its own for every process (the
    projection)."""
    w, n = r["worker_cpu_seconds_per_step"], r["workers"]
    s_max, s_all = r["shard_cpu_seconds_per_round"], r["all_shards_cpu_seconds_per_round"]
    if cores is None:
        return w + s_max
    return max(w, n * w / cores) + max(s_max, s_all / cores)


def slope(xs, ys):
    """Least-squares slope and intercept of ys over xs (slope 0 for one point)."""
    if len(xs) < 2:
        return 0.0, ys[0]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return b, my - b * mx


def fmt(x):
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def other(r, a):
    load = r["other_load_cores"] / a.cores
    return f" (+{load * 100:.0f}% other)" if load >= 0.05 else ""


def tables(runs, growth, a):
    lines = [
        f"| codec | shards | workers | round s (median, steps {a.drop + 1}..{a.steps}) "
        f"| CPU use of {a.cores} cores | CPU-bound | model s, this machine "
        "| projected s, dedicated hosts | busiest shard CPU s / round "
        "| its minor faults / round | MB in / shard / round | MB out / shard / round "
        "| worker CPU s / step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['codec']} | {r['shards']} | {r['workers']} | {r['round_seconds']:.3f} "
            f"| {r['cpu_use'] * 100:.0f}%{other(r, a)} | {'yes' if r['cpu_bound'] else 'no'} "
            f"| {r['model_round_seconds']:.3f} | {r['projected_round_seconds']:.3f} "
            f"| {r['shard_cpu_seconds_per_round']:.3f} | {fmt(r['shard_minor_faults_per_round'])} "
            f"| {fmt(r['shard_bytes_in_per_round'] / MB)} | {fmt(r['shard_bytes_out_per_round'] / MB)} "
            f"| {r['worker_cpu_seconds_per_step']:.3f} |")
    lines += ["", "| codec | shards | round s per added worker, measured "
              "| round s per added worker, projected | busiest shard CPU s / round per added worker |",
              "|---|---|---|---|---|"]
    for g in growth:
        lines.append(f"| {g['codec']} | {g['shards']} | {g['round_seconds_per_worker']:.4f} "
                     f"| {g['projected_round_seconds_per_worker']:.4f} "
                     f"| {g['shard_cpu_seconds_per_round_per_worker']:.4f} |")
    return lines


# Blues for fp32, reds for 1-bit; the more shards, the darker.
COLORS = {("fp32", 1): "#6baed6", ("fp32", 2): "#2171b5", ("fp32", 4): "#08306b",
          ("onebit", 1): "#fb6a4a", ("onebit", 2): "#cb181d", ("onebit", 4): "#67000d"}
EXTRA = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def nice(v, rounding):
    """The nearest 1, 2 or 5 x 10^k below (math.floor) or above (math.ceil) v."""
    e = math.floor(math.log10(v))
    steps = [m * 10.0 ** k for k in (e - 1, e, e + 1) for m in (1, 2, 5)]
    return max(x for x in steps if x <= v * 1.0001) if rounding is math.floor else \
        min(x for x in steps if x >= v * 0.9999)


def svg(runs, a):
    """Round time against workers, both log scales: a line per shards x codec,
    measured solid (a hollow marker where CPU-bound), projected dashed."""
    W, H, left, right, top, bottom = 760, 480, 70, 190, 40, 60
    ws = sorted({r["workers"] for r in runs})
    ys = [v for r in runs for v in (r["round_seconds"], r["projected_round_seconds"]) if v > 0]
    ylo, yhi = nice(min(ys), math.floor), nice(max(ys), math.ceil)
    xlo, xhi = math.log2(ws[0]), math.log2(ws[-1]) if ws[-1] > ws[0] else math.log2(ws[0]) + 1

    def x(w):
        return left + (math.log2(w) - xlo) / (xhi - xlo) * (W - left - right)

    def y(v):
        return top + (1 - (math.log10(max(v, ylo)) - math.log10(ylo)) /
                      (math.log10(yhi) - math.log10(ylo))) * (H - top - bottom)

    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         'font-family="sans-serif" font-size="12">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{left}" y="22" font-size="13">Round time against workers: '
         f'{a.params / 1e6:g}M parameters on loopback, {a.cores} cores</text>']
    e = math.floor(math.log10(ylo))
    while 10 ** e <= yhi * 1.001:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if ylo * 0.999 <= v <= yhi * 1.001:
                s.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{W - right}" y2="{y(v):.1f}" '
                         f'stroke="{"#ccc" if m == 1 else "#eee"}"/>')
                s.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        e += 1
    for w in ws:
        s.append(f'<line x1="{x(w):.1f}" y1="{top}" x2="{x(w):.1f}" y2="{H - bottom}" stroke="#eee"/>')
        s.append(f'<text x="{x(w):.1f}" y="{H - bottom + 16}" text-anchor="middle">{w}</text>')
    s.append(f'<text x="{(left + W - right) / 2:.0f}" y="{H - bottom + 36}" '
             'text-anchor="middle">workers (log scale)</text>')
    s.append(f'<text transform="translate(18,{(top + H - bottom) / 2:.0f}) rotate(-90)" '
             'text-anchor="middle">seconds per round (log scale)</text>')
    keys = sorted({(r["codec"], r["shards"]) for r in runs})
    for i, key in enumerate(keys):
        color = COLORS.get(key, EXTRA[i % len(EXTRA)])
        line = sorted((r for r in runs if (r["codec"], r["shards"]) == key), key=lambda r: r["workers"])
        for field, dash in (("round_seconds", ""), ("projected_round_seconds", ' stroke-dasharray="6,4"')):
            pts = " ".join(f"{x(r['workers']):.1f},{y(r[field]):.1f}" for r in line)
            s.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for r in line:
            fill = "white" if r["cpu_bound"] else color
            s.append(f'<circle cx="{x(r["workers"]):.1f}" cy="{y(r["round_seconds"]):.1f}" r="3.5" '
                     f'fill="{fill}" stroke="{color}" stroke-width="1.5"/>')
        ly = top + 10 + 18 * i
        s.append(f'<line x1="{W - right + 14}" y1="{ly}" x2="{W - right + 40}" y2="{ly}" '
                 f'stroke="{color}" stroke-width="2"/>'
                 f'<text x="{W - right + 46}" y="{ly + 4}">{key[0]}, {key[1]} shard{"s" if key[1] > 1 else ""}</text>')
    ly = top + 10 + 18 * len(keys) + 14
    s.append(f'<line x1="{W - right + 14}" y1="{ly}" x2="{W - right + 40}" y2="{ly}" stroke="black" '
             f'stroke-width="2"/><text x="{W - right + 46}" y="{ly + 4}">measured</text>')
    s.append(f'<line x1="{W - right + 14}" y1="{ly + 18}" x2="{W - right + 40}" y2="{ly + 18}" '
             f'stroke="black" stroke-width="2" stroke-dasharray="6,4"/>'
             f'<text x="{W - right + 46}" y="{ly + 22}">projected, dedicated</text>')
    s.append(f'<text x="{W - right + 46}" y="{ly + 36}">hosts</text>')
    s.append(f'<circle cx="{W - right + 27}" cy="{ly + 52}" r="3.5" fill="white" stroke="black" '
             f'stroke-width="1.5"/><text x="{W - right + 46}" y="{ly + 56}">CPU-bound</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


def main():
    ap = argparse.ArgumentParser()
    for f in ("runs_dir", "out", "codecs", "shards", "workers", "cpu_model", "commit"):
        ap.add_argument("--" + f, required=True)
    for f in ("params", "tensors", "steps", "drop", "freeze_step", "cores", "sweep_seconds"):
        ap.add_argument("--" + f, type=int, required=True)
    a = ap.parse_args()

    runs = []
    for codec in a.codecs.split():
        for ns in map(int, a.shards.split()):
            for nw in map(int, a.workers.split()):
                runs.append(config(os.path.join(a.runs_dir, f"{codec}_s{ns}_w{nw}"), codec, ns, nw, a))
    growth = []
    for codec in a.codecs.split():
        for ns in map(int, a.shards.split()):
            line = [r for r in runs if r["codec"] == codec and r["shards"] == ns]
            xs = [r["workers"] for r in line]
            g = {"codec": codec, "shards": ns}
            for key, field in (("round_seconds", "round_seconds"),
                               ("projected_round_seconds", "projected_round_seconds"),
                               ("shard_cpu_seconds_per_round", "shard_cpu_seconds_per_round")):
                b, c = slope(xs, [r[field] for r in line])
                g[key + "_per_worker"], g[key + "_intercept"] = b, c
            growth.append(g)

    header = [
        f"Machine: {a.cpu_model}, {a.cores} cores; commit {a.commit}; the sweep took "
        f"{a.sweep_seconds / 60:.0f} min." if a.sweep_seconds >= 120 else
        f"Machine: {a.cpu_model}, {a.cores} cores; commit {a.commit}; the sweep took "
        f"{a.sweep_seconds} s.",
        f"Model: pserver_worker --model=synthetic, {a.params} parameters in {a.tensors} tensors; "
        f"{a.steps} steps per configuration; every shard and worker a process of this machine, "
        "on loopback.",
        "fp32: --optimizer=adam, fp32 pushes and pulls. onebit: --optimizer=onebit_adam "
        f"--freeze_step={a.freeze_step}, bf16 pushes until the freeze, then 1-bit; 1-bit pulls.",
    ]
    notes = [
        f"Round s: the slowest worker's median step over steps {a.drop + 1}..{a.steps}. CPU and "
        f"bytes: over the window from shard 0's round R0 >= {a.drop} to the last worker's summary "
        "(/proc/PID/stat utime + stime and minflt, the shards' payload byte counters; framing not "
        "counted); the table shows the busiest shard (scaling.json has every shard and worker).",
        f"CPU use: every shard's and worker's CPU in the window / ({a.cores} cores x the window), "
        "and in brackets other programs' (the machine's busy time from /proc/stat less ours) "
        f"where 5% or more; CPU-bound when the two reach {CPU_BOUND * 100:.0f}%: the processes "
        "queued for the cores, so the measured round is longer than on dedicated hosts.",
        "Model (docs/benchmarks.md, \"Scaling: workers and shards\"): a round is a worker "
        "phase, then a shard phase; each takes its busiest process's CPU time or all its "
        "processes' CPU time / C cores, whichever is longer: max(w, W x w / C) + max(s, all "
        "shards' s / C), w the worker CPU s / step, s the busiest shard's CPU s / round, "
        f"C = {a.cores} less the cores other programs used. Projected, a host per process and "
        "a network as fast as loopback: w + s.",
        "Growth per added worker: least-squares slope over the workers of each line.",
    ]
    ratios = sorted(r["measured_over_model"] for r in runs)
    notes.append(f"The model against the measurement on this machine: measured / model "
                 f"{statistics.median(ratios):.2f} in the median, {ratios[0]:.2f} to {ratios[-1]:.2f} "
                 "over the rows (above 1: waiting the model does not see, RPC latency and "
                 "scheduling; below 1: the two phases overlapped, chunks in flight).")
    load = sorted(r["other_load_cores"] for r in runs)
    notes.append(f"Other programs used {statistics.median(load):.2f} cores in the median window, "
                 f"{load[-1]:.2f} at most: the model counts the cores they left, the measured "
                 "rounds are as slow as they made them.")
    notes.append(f"Peak RSS: a worker at most {max(r['worker_peak_rss_bytes'] for r in runs) / 2**20:.0f} MiB, "
                 f"a shard at most {max(s['peak_rss_bytes'] for r in runs for s in r['per_shard']) / 2**20:.0f} MiB.")
    lines = tables(runs, growth, a)
    md = "\n".join(header) + "\n\n" + "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "scaling.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "scaling.json"), "w") as f:
        json.dump({"settings": {"params": a.params, "tensors": a.tensors, "steps": a.steps,
                                "steps_dropped": a.drop, "freeze_step": a.freeze_step,
                                "cores": a.cores, "cpu_model": a.cpu_model, "commit": a.commit,
                                "sweep_seconds": a.sweep_seconds, "cpu_bound_at": CPU_BOUND},
                   "notes": header + notes, "growth": growth, "runs": runs}, f, indent=1)
        f.write("\n")
    with open(os.path.join(a.out, "scaling.svg"), "w") as f:
        f.write(svg(runs, a))
    print("\n".join(header))
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
