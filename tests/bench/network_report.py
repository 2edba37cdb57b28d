"""Turns the raw data of tests/bench/network.sh into network.md, network.json
and network.svg (and the table on stdout); with --layout=colocated (one shard
on each worker host) into network_colocated.*, which also compares its runs
with the dedicated layout's network.json in the same folder when that one has
the same settings. Standard library only.

Per run (RUNS_DIR/NAME/):
  pserver: w<k>.json, each worker's --summary_json (step_seconds,
           step_push_bytes, step_pull_bytes: one entry per step);
           shard<s>.metrics, each shard's /metrics page at the end;
  ddp:     r<k>.json from network_ddp.py (step_seconds, allreduce_bytes);
  both:    tc.before / tc.after, bytes through every host's tbf qdiscs.

Figures:
  median step   the slowest worker's median over steps DROP+1..STEPS
  average step  the slowest worker's mean over all steps (warmup included;
                not registration or process-group setup)
  bytes up/down per worker per step
                pserver: the encoded payload pushed / pulled (medians over the
                kept steps, mean over workers; gRPC/HTTP2/TCP framing not
                counted). DDP: not measured but computed as the ring
                allreduce volume 2(N-1)/N x B, sent and the same received,
                B the bytes of one allreduce of the step's gradient as the
                hook sends it (fp32 4 bytes/parameter, fp16 2, PowerSGD the
                fp32 factors P and Q).
  busiest link  pserver: a shard's link; a synchronous step's push and pull do
                not overlap, so its ingress plus its egress: the shard's share
                of all shards' payload bytes (from their /metrics counters)
                x the workers' up+down bytes per step. Co-located (shard i on
                worker i's host, N of each; a worker's bytes to its own shard
                stay on the host): a host's link, one direction, since in the
                push every host sends its worker's pushes to the other shards
                while the other workers' pushes come in, and in the pull the
                same the other way; per phase the larger direction over hosts,
                max(up x (1 - f), (N-1) x up x f) with f a shard's share, and
                the same for down, summed over the two phases (equal shares:
                (N-1)/N x (up + down)). DDP: a worker's link;
                the ring sends and receives at once on full-duplex links, so
                one direction: 2(N-1)/N x B.
  wire limit    busiest link bytes per step / rate
  CPU per step  workers (and DDP ranks): the slowest one's median CPU seconds
                per step over the kept steps (its own getrusage / process
                time, every thread); shards: process_cpu_seconds_total from
                the /metrics page taken when its step reached DROP to the
                one at the end, over the rounds between, the busiest shard.
                Measured with every process sharing the machine's cores.
  dedicated-host estimate
                what the step would take with every process on cores of its
                own, from the link and the CPU figures: at best the largest
                of the wire limit, the worker's CPU and the shard's CPU (all
                overlapped, as chunked streaming pipelines them), at worst
                their sum (nothing overlapped; DDP: wire + rank CPU).
  tc            the bytes the busiest link's tbf qdiscs really carried,
                divided by STEPS: the whole run including setup, with all
                framing (a check on the computed figure, not a replacement);
                ingress plus egress for the dedicated layout's shard links,
                the larger direction for co-located hosts and DDP.
"""

import argparse
import json
import math
import os
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def read_tc(path):
    out = {}
    with open(path) as f:
        for line in f:
            host, way, n = line.split()
            out[(host, way)] = int(n)
    return out


def metric_sum(path, name):
    total = 0.0
    pat = re.compile(r"^" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)")
    with open(path) as f:
        for line in f:
            m = pat.match(line)
            if m:
                total += float(m.group(2))
    return total


def median_cpu(summaries, drop):
    """The slowest process's median CPU seconds per step after `drop`, or
    None for summaries without per-step CPU (runs made before it)."""
    per = [statistics.median(x["step_cpu_seconds"][drop:]) for x in summaries
           if len(x.get("step_cpu_seconds", [])) > drop]
    return max(per) if per and len(per) == len(summaries) else None


def shard_cpu_per_round(rd, s):
    """Shard s's CPU seconds per round from its /metrics at step DROP
    (shard<s>.drop) to the end (shard<s>.metrics); None without both."""
    start, end = os.path.join(rd, f"shard{s}.drop"), os.path.join(rd, f"shard{s}.metrics")
    if not (os.path.exists(start) and os.path.exists(end)):
        return None
    rounds = metric_sum(end, "pserver_server_step") - metric_sum(start, "pserver_server_step")
    if rounds <= 0:
        return None
    return (metric_sum(end, "process_cpu_seconds_total") -
            metric_sum(start, "process_cpu_seconds_total")) / rounds


def tc_delta(rd):
    before, after = read_tc(os.path.join(rd, "tc.before")), read_tc(os.path.join(rd, "tc.after"))
    hosts = sorted({h for h, _ in after})
    return {h: (after[(h, "in")] - before[(h, "in")], after[(h, "out")] - before[(h, "out")])
            for h in hosts}


def files(rd, prefix):
    names = sorted(n for n in os.listdir(rd) if re.fullmatch(prefix + r"\d+\.json", n))
    return [load(os.path.join(rd, n)) for n in names]


def pserver_run(name, rd, a):
    workers = files(rd, "w")
    if not workers:
        sys.exit(f"network_report.py: no worker summaries in {rd}")
    meta = dict(l.rstrip("\n").split("=", 1) for l in open(os.path.join(rd, "meta")))
    steps = [w["step_seconds"] for w in workers]
    kept = [s[a.drop:] for s in steps]
    up = statistics.mean(statistics.median(w["step_push_bytes"][a.drop:]) for w in workers)
    down = statistics.mean(statistics.median(w["step_pull_bytes"][a.drop:]) for w in workers)
    shard_bytes = []
    for s in sorted(n for n in os.listdir(rd) if n.endswith(".metrics")):
        p = os.path.join(rd, s)
        shard_bytes.append(metric_sum(p, "pserver_server_received_payload_bytes_total") +
                           metric_sum(p, "pserver_server_sent_payload_bytes_total"))
    share = max(shard_bytes) / sum(shard_bytes)
    shard_cpu = [shard_cpu_per_round(rd, i) for i in range(len(shard_bytes))]
    tc = tc_delta(rd)
    if a.layout == "colocated":
        n = len(workers)
        shares = [b / sum(shard_bytes) for b in shard_bytes]
        busiest = sum(max(max(x * (1 - f), (n - 1) * x * f) for f in shares) for x in (up, down))
        link = "co-located host (one direction)"
        tc_busiest = max(max(i, o) for i, o in tc.values()) / a.steps
    else:
        shard_link = share * len(workers) * (up + down)
        busiest = max(shard_link, up + down)
        link = "shard (ingress + egress)" if shard_link >= up + down else "worker (ingress + egress)"
        tc_busiest = max(i + o for i, o in tc.values()) / a.steps
    return {
        "name": name, "kind": "pserver",
        "settings": f"server {meta['server_flags']}; worker {meta['worker_flags']}",
        "median_step_seconds": max(statistics.median(k) for k in kept),
        "average_step_seconds": max(statistics.mean(s) for s in steps),
        "bytes_up_per_worker_per_step": up,
        "bytes_down_per_worker_per_step": down,
        "bytes_note": "encoded payload from the workers' summaries (median of kept steps)",
        "busiest_link": link,
        "busiest_shard_share": share,
        "busiest_link_bytes_per_step": busiest,
        "tc_busiest_link_bytes_per_step_whole_run": tc_busiest,
        "worker_cpu_seconds_per_step": median_cpu(workers, a.drop),
        "shard_cpu_seconds_per_round": (max(shard_cpu) if shard_cpu and
                                        None not in shard_cpu else None),
        "step_seconds": steps,
    }


def ddp_run(name, rd, a):
    ranks = files(rd, "r")
    if not ranks:
        sys.exit(f"network_report.py: no rank results in {rd}")
    n = ranks[0]["world_size"]
    b = ranks[0]["allreduce_bytes"]
    ring = 2 * (n - 1) / n * b
    steps = [r["step_seconds"] for r in ranks]
    kept = [s[a.drop:] for s in steps]
    tc = tc_delta(rd)
    tc_busiest = max(max(i, o) for h, (i, o) in tc.items() if h.startswith("w")) / a.steps
    hook = ranks[0]["hook"]
    settings = {"fp32": "DDP allreduce, fp32",
                "fp16": "fp16_compress_hook",
                "powersgd": f"powerSGD_hook rank {ranks[0]['powersgd_rank']}, "
                            f"compressing from step {ranks[0]['compressed_from_step'] + 1}"}[hook]
    return {
        "name": name, "kind": "ddp",
        "settings": f"{settings}; gloo, {n} ranks, torch.optim.Adam, "
                    f"{ranks[0]['threads']} thread(s) per rank",
        "median_step_seconds": max(statistics.median(k) for k in kept),
        "average_step_seconds": max(statistics.mean(s) for s in steps),
        "bytes_up_per_worker_per_step": ring,
        "bytes_down_per_worker_per_step": ring,
        "bytes_note": f"computed: ring allreduce 2(N-1)/N x {b} bytes, N={n}",
        "busiest_link": "worker (one direction)",
        "busiest_link_bytes_per_step": ring,
        "tc_busiest_link_bytes_per_step_whole_run": tc_busiest,
        "compressed_from_step": ranks[0]["compressed_from_step"],
        "worker_cpu_seconds_per_step": median_cpu(ranks, a.drop),
        "shard_cpu_seconds_per_round": None,
        "step_seconds": steps,
    }


def fmt(x, digits=3):
    return f"{x:.{digits}g}" if x < 100 else f"{x:.0f}"


def table(runs, a):
    lines = [
        f"| run | median step s (steps {a.drop + 1}..{a.steps}) | average step s (all {a.steps}) "
        "| MB up / worker / step | MB down / worker / step | busiest link MB / step "
        f"| wire limit s at {a.rate} | step / limit | tc: busiest link MB / step (whole run) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['name']} | {r['median_step_seconds']:.3f} | {r['average_step_seconds']:.3f} "
            f"| {fmt(r['bytes_up_per_worker_per_step'] / 1e6)} "
            f"| {fmt(r['bytes_down_per_worker_per_step'] / 1e6)} "
            f"| {fmt(r['busiest_link_bytes_per_step'] / 1e6)} | {r['wire_limit_seconds']:.3f} "
            f"| {r['step_over_limit']:.2f} | {fmt(r['tc_busiest_link_bytes_per_step_whole_run'] / 1e6)} |")
    return lines


def estimate(r):
    """(overlapped, sequential) step seconds on dedicated hosts, or None
    without the CPU figures."""
    w = r["worker_cpu_seconds_per_step"]
    if w is None:
        return None
    parts = [r["wire_limit_seconds"], w]
    if r["kind"] == "pserver":
        if r["shard_cpu_seconds_per_round"] is None:
            return None
        parts.append(r["shard_cpu_seconds_per_round"])
    return max(parts), sum(parts)


def cpu_table(runs):
    lines = [
        "| run | worker CPU s / step | busiest shard CPU s / round | wire limit s "
        "| dedicated hosts: step s, overlapped .. sequential |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        w, sh, e = (r["worker_cpu_seconds_per_step"], r["shard_cpu_seconds_per_round"],
                    r.get("dedicated_estimate_seconds"))
        lines.append(f"| {r['name']} | {'-' if w is None else f'{w:.3f}'} "
                     f"| {'-' if sh is None else f'{sh:.3f}'} | {r['wire_limit_seconds']:.3f} "
                     f"| {'-' if e is None else f'{e[0]:.3f} .. {e[1]:.3f}'} |")
    return lines


def estimate_comparisons(runs):
    by = {r["name"]: r for r in runs}
    out = []
    for fast in ("onebit", "topk"):
        for base in ("fp32", "ddp_fp32"):
            f, b = by.get(fast), by.get(base)
            if not (f and b and f.get("dedicated_estimate_seconds")
                    and b.get("dedicated_estimate_seconds")):
                continue
            fe, be = f["dedicated_estimate_seconds"], b["dedicated_estimate_seconds"]
            out.append(f"dedicated hosts (estimate): {fast} is {be[0] / fe[0]:.1f}x faster than "
                       f"{base} overlapped, {be[1] / fe[1]:.1f}x sequential")
    return out


def comparisons(runs, dedicated=None):
    """Speed-ups between runs; with `dedicated` (the dedicated layout's
    network.json, same settings) each co-located pserver run against it."""
    by = {r["name"]: r for r in runs}
    out = []
    measured = {x["name"]: x for x in dedicated["runs"]} if dedicated else {}
    for r in runs:
        d = measured.get(r["name"])
        if r["kind"] == "pserver" and d:
            out.append(f"{r['name']} co-located takes {r['median_step_seconds'] / d['median_step_seconds']:.2f}x "
                       f"the step (median) of 2 dedicated shard hosts ({d['median_step_seconds']:.3f} s "
                       f"in network.json); its wire limit is "
                       f"{d['wire_limit_seconds'] / r['wire_limit_seconds']:.2f}x lower")
    for fast in ("onebit", "topk"):
        for base in ("fp32", "ddp_fp32"):
            if fast in by and base in by:
                f, b = by[fast], by[base]
                out.append(f"{fast} is {b['median_step_seconds'] / f['median_step_seconds']:.1f}x faster "
                           f"than {base} in steady state (median step of the "
                           f"kept steps), {b['average_step_seconds'] / f['average_step_seconds']:.1f}x "
                           "over the whole run (average step, warmup "
                           "included), moving "
                           f"{(b['bytes_up_per_worker_per_step'] + b['bytes_down_per_worker_per_step']) / (f['bytes_up_per_worker_per_step'] + f['bytes_down_per_worker_per_step']):.0f}x "
                           "fewer bytes per worker")
    if "fp32" in by and "ddp_fp32" in by:
        out.append(f"fp32 takes {by['fp32']['median_step_seconds'] / by['ddp_fp32']['median_step_seconds']:.1f}x "
                   "the step of ddp_fp32")
    for r in runs:
        out.append(f"{r['name']}: whole-run average / median = "
                   f"{r['average_step_seconds'] / r['median_step_seconds']:.2f}")
    return out


def svg(runs, a):
    """Horizontal bars on a log time axis: the median step (bar), the
    whole-run average (black tick) and the wire limit (red line)."""
    W, row, left, right, top = 760, 34, 110, 30, 40
    H = top + row * len(runs) + 70
    values = [v for r in runs for v in (r["median_step_seconds"], r["average_step_seconds"],
                                        r["wire_limit_seconds"]) if v > 0]
    lo = 10 ** math.floor(math.log10(min(values)))
    hi = 10 ** math.ceil(math.log10(max(values)))
    if hi <= lo:
        hi = lo * 10

    def x(v):
        return left + (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (W - left - right)

    bottom = top + row * len(runs)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         'font-family="sans-serif" font-size="12">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{left}" y="20" font-size="13">pserver and DDP on {a.rate} links: '
         f'{a.params / 1e6:g}M parameters, {SHARDS_TEXT[a.layout]}, {a.steps} steps</text>']
    e = math.log10(lo)
    while e <= math.log10(hi) + 1e-9:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if v < lo * 0.999 or v > hi * 1.001:
                continue
            xv = x(v)
            s.append(f'<line x1="{xv:.1f}" y1="{top - 6}" x2="{xv:.1f}" y2="{bottom}" '
                     f'stroke="{"#ccc" if m == 1 else "#eee"}"/>')
            s.append(f'<text x="{xv:.1f}" y="{bottom + 16}" text-anchor="middle">{v:g}</text>')
        e += 1
    s.append(f'<text x="{(left + W - right) / 2:.0f}" y="{bottom + 34}" text-anchor="middle">'
             'seconds per step (log scale)</text>')
    for i, r in enumerate(runs):
        y = top + i * row
        color = "#1f77b4" if r["kind"] == "pserver" else "#ff7f0e"
        s.append(f'<text x="{left - 8}" y="{y + row / 2 + 4:.0f}" text-anchor="end">{r["name"]}</text>')
        s.append(f'<rect x="{left}" y="{y + 6}" width="{x(r["median_step_seconds"]) - left:.1f}" '
                 f'height="{row - 12}" fill="{color}"/>')
        xa = x(r["average_step_seconds"])
        s.append(f'<line x1="{xa:.1f}" y1="{y + 3}" x2="{xa:.1f}" y2="{y + row - 3}" '
                 'stroke="black" stroke-width="2"/>')
        xl = x(r["wire_limit_seconds"])
        s.append(f'<line x1="{xl:.1f}" y1="{y + 1}" x2="{xl:.1f}" y2="{y + row - 1}" '
                 'stroke="#d62728" stroke-width="3" stroke-dasharray="4,2"/>')
        label = f'{r["median_step_seconds"]:.2f} s ({r["step_over_limit"]:.1f}x limit)'
        xm = x(r["median_step_seconds"])
        if xm + 130 > W:  # no room right of the bar: inside it, in white
            s.append(f'<text x="{xm - 6:.1f}" y="{y + row / 2 + 4:.0f}" font-size="10" '
                     f'text-anchor="end" fill="white">{label}</text>')
        else:
            s.append(f'<text x="{xm + 4:.1f}" y="{y + row / 2 + 4:.0f}" font-size="10">{label}</text>')
    ly = bottom + 52
    s.append(f'<rect x="{left}" y="{ly - 9}" width="12" height="10" fill="#1f77b4"/>'
             f'<rect x="{left + 14}" y="{ly - 9}" width="12" height="10" fill="#ff7f0e"/>'
             f'<text x="{left + 30}" y="{ly}">median step after {a.drop} (pserver, DDP)</text>')
    s.append(f'<line x1="{left + 250}" y1="{ly - 10}" x2="{left + 250}" y2="{ly + 2}" stroke="black" stroke-width="2"/>'
             f'<text x="{left + 256}" y="{ly}">whole-run average</text>')
    s.append(f'<line x1="{left + 380}" y1="{ly - 10}" x2="{left + 380}" y2="{ly + 2}" stroke="#d62728" '
             f'stroke-width="3" stroke-dasharray="4,2"/><text x="{left + 386}" y="{ly}">wire limit '
             '(busiest link bytes / rate)</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


SHARDS_TEXT = {"dedicated": "2 shards, 4 workers",
               "colocated": "4 shards co-located with 4 workers"}


def same_settings(path, settings):
    """The dedicated layout's network.json at `path` when it was measured with
    these settings (rate, burst, model, steps), else None."""
    try:
        with open(path) as f:
            other = json.load(f)
    except (OSError, ValueError):
        return None
    keys = [k for k in settings if k not in ("layout", "shards", "workers")]
    if other.get("settings", {}).get("layout", "dedicated") != "dedicated" or \
            any(other["settings"].get(k) != settings[k] for k in keys):
        return None
    return other


def main():
    ap = argparse.ArgumentParser()
    for f in ("runs_dir", "runs", "rate", "out"):
        ap.add_argument("--" + f, required=True)
    for f in ("rate_bps", "params", "tensors", "steps", "drop", "freeze_step", "burst"):
        ap.add_argument("--" + f, type=int, required=True)
    ap.add_argument("--k_fraction", type=float, required=True)
    ap.add_argument("--layout", choices=("dedicated", "colocated"), default="dedicated")
    a = ap.parse_args()
    base = "network" if a.layout == "dedicated" else f"network_{a.layout}"

    runs = []
    for name in a.runs.split():
        rd = os.path.join(a.runs_dir, name)
        kind = open(os.path.join(rd, "meta")).readline().strip()
        r = pserver_run(name, rd, a) if kind == "kind=pserver" else ddp_run(name, rd, a)
        r["wire_limit_seconds"] = r["busiest_link_bytes_per_step"] * 8 / a.rate_bps
        r["step_over_limit"] = r["median_step_seconds"] / r["wire_limit_seconds"]
        r["dedicated_estimate_seconds"] = estimate(r)
        runs.append(r)

    hosts = {"dedicated": "2 shard hosts, 4 worker hosts, one bridge.",
             "colocated": "4 hosts, each running one shard and one worker (co-located: a worker's "
                          "bytes to its own shard stay on its host), one bridge."}[a.layout]
    notes = [
        f"Links: every host's veth shaped with tc tbf at {a.rate} in each direction "
        f"(burst {a.burst} bytes); {hosts}",
        f"Model: {a.params} parameters in {a.tensors} tensors (pserver_worker --model=synthetic; "
        "DDP: the same sizes as 2-D tensors), seeded random gradients.",
        f"Median step: the slowest worker's median over steps {a.drop + 1}..{a.steps} "
        f"(the first {a.drop} dropped: connections, 1-bit Adam's warmup of {a.freeze_step} rounds "
        "with bf16 pushes, PowerSGD's uncompressed first steps); average step: the slowest "
        "worker's mean over all steps, warmup included.",
        "MB: 10^6 bytes. Bytes: pserver from the workers' summaries (encoded payload; framing not counted); "
        "DDP computed as the ring allreduce volume 2(N-1)/N x the bytes of one allreduce of "
        "the gradient (sent, and the same received, per worker).",
        "Wire limit: pserver a shard link's ingress plus egress per step (push and pull do not "
        "overlap in a synchronous step); DDP a worker link's one direction (the ring sends and "
        "receives at once). tc column: what the busiest link's qdiscs carried over the whole "
        "run (setup and framing included) / steps.",
    ]
    if a.layout == "colocated":
        notes[-1] = (
            "Wire limit: pserver a host link's one direction, summed over the push and the pull "
            "(each host sends and receives at once in both: its worker's pushes to the other 3 "
            "shards go out while the other workers' pushes to its shard come in), (N-1)/N x "
            "(up + down) with equal shards; DDP a worker link's one direction (the ring sends and "
            "receives at once). tc column: the larger direction of the busiest host's qdiscs over "
            "the whole run (setup and framing included) / steps.")
    for r in runs:
        if r["kind"] == "ddp" and r.get("compressed_from_step", 0) > a.drop:
            notes.append(f"{r['name']}: DROP {a.drop} keeps uncompressed steps; its median is not steady-state.")
    settings = {"rate": a.rate, "rate_bits_per_second": a.rate_bps,
                "burst_bytes": a.burst, "params": a.params, "tensors": a.tensors,
                "steps": a.steps, "steps_dropped": a.drop,
                "freeze_step": a.freeze_step, "k_fraction": a.k_fraction,
                "shards": 2 if a.layout == "dedicated" else 4, "workers": 4, "layout": a.layout}
    dedicated = None
    if a.layout != "dedicated":
        dedicated = same_settings(os.path.join(a.out, "network.json"), settings)
        if dedicated is None:
            notes.append("No network.json of the dedicated layout with these settings in this "
                         "folder: no comparison between layouts.")
    lines = table(runs, a)
    if any(r["worker_cpu_seconds_per_step"] is not None for r in runs):
        lines += [""] + cpu_table(runs)
    cmp_lines = comparisons(runs, dedicated) + estimate_comparisons(runs)
    md = "\n".join(lines) + "\n\n" + "\n".join(f"- {c}" for c in cmp_lines) + "\n\n" + \
        "\n".join(f"{n}" for n in notes) + "\n\nSettings per run:\n\n" + \
        "\n".join(f"- {r['name']}: {r['settings']}" for r in runs) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"{base}.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, f"{base}.json"), "w") as f:
        json.dump({"settings": settings, "notes": notes, "runs": runs}, f, indent=1)
        f.write("\n")
    with open(os.path.join(a.out, f"{base}.svg"), "w") as f:
        f.write(svg(runs, a))
    print("\n".join(lines))
    print()
    print("\n".join(cmp_lines))


if __name__ == "__main__":
    main()
