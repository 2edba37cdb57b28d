#!/usr/bin/env python3
"""The report of tests/bench/node_push.sh: one push per machine against one
push per worker, and both against DDP fp32, on N shaped machines.

  /usr/bin/python3 tests/bench/node_push_report.py --work WORK --out OUT \
      --steps 40 --rate 100mbit

Reads WORK/<machines>/<row>/<seed>/{from,to}[.tc] (the window's
snapshots) and final; writes OUT/node_push.json and OUT/node_push.md:
per row, medians over the seeds of the bytes per step on each machine's
link (both ways; the mean over machines and the busiest), the seconds per
step, and the CPU seconds per step (each machine's processes, and all of
them: on one 2-core box a row near 2 CPU seconds per second is CPU-bound);
then the issue's ratios, each with its target and met or missed.
"""

import argparse
import json
import pathlib
import statistics
import sys

ROWS = ("ddp_fp32", "ps_fp32_flat", "ps_fp32_node", "ps_onebit_flat",
        "ps_onebit_node")
GROUP = 2  # workers per machine


def _read(path):
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        out[tuple(parts[:-1])] = float(parts[-1])
    return out


def window(rd, machines, steps):
    """One run's figures over its window."""
    a, b = _read(rd / "from"), _read(rd / "to")
    ta, tb = _read(rd / "from.tc"), _read(rd / "to.tc")
    link = [sum(tb[(f"m{m}", way)] - ta[(f"m{m}", way)]
                for way in ("in", "out")) / steps for m in range(machines)]
    cpu = [(b[(f"m{m}", "cpu_ms")] - a[(f"m{m}", "cpu_ms")]) / 1000 / steps
           for m in range(machines)]
    final = (rd / "final").read_text().split() if (rd / "final").exists() \
        else []
    return {"link_bytes_per_step": link,
            "seconds_per_step": (b[("time",)] - a[("time",)]) / steps,
            "cpu_seconds_per_step": cpu,
            "final_val_loss": float(final[1]) if len(final) > 1 else None}


def summarize(runs):
    med = statistics.median
    return {
        "runs": len(runs),
        "link_bytes_per_step_mean": med(statistics.fmean(
            r["link_bytes_per_step"]) for r in runs),
        "link_bytes_per_step_busiest": med(max(r["link_bytes_per_step"])
                                           for r in runs),
        "seconds_per_step": med(r["seconds_per_step"] for r in runs),
        "seconds_per_step_range": [min(r["seconds_per_step"] for r in runs),
                                   max(r["seconds_per_step"] for r in runs)],
        "cpu_seconds_per_step_machine": med(statistics.fmean(
            r["cpu_seconds_per_step"]) for r in runs),
        "cpu_seconds_per_step_all": med(sum(r["cpu_seconds_per_step"])
                                        for r in runs),
    }


def ratios(rows):
    """The issue's targets where both rows ran."""
    out = []

    def add(name, value, target, met):
        out.append({"what": name, "value": value, "target": target,
                    "met": met})
    for codec in ("fp32", "onebit"):
        flat, node = rows.get(f"ps_{codec}_flat"), rows.get(f"ps_{codec}_node")
        if flat and node:
            cut = (flat["link_bytes_per_step_mean"]
                   / node["link_bytes_per_step_mean"])
            add(f"{codec}: bytes per step on a machine's link, flat / node",
                cut, f">= {GROUP / 1.1:.2f} (G = {GROUP} within 10%)",
                cut >= GROUP / 1.1)
    flat, node = rows.get("ps_onebit_flat"), rows.get("ps_onebit_node")
    ddp = rows.get("ddp_fp32")
    if flat and node:
        add("1-bit: seconds per step, flat / node",
            flat["seconds_per_step"] / node["seconds_per_step"], "> 1",
            flat["seconds_per_step"] > node["seconds_per_step"])
    if ddp and node:
        r = ddp["seconds_per_step"] / node["seconds_per_step"]
        add("seconds per step, ddp_fp32 / ps_onebit_node (per step, not "
            "time to a loss)", r, ">= 6", r >= 6)
    for row in ("ps_fp32_flat", "ps_fp32_node"):
        if ddp and rows.get(row):
            r = rows[row]["seconds_per_step"] / ddp["seconds_per_step"]
            add(f"seconds per step, {row} / ddp_fp32", r, "<= 1.15",
                r <= 1.15)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True,
                   help="steps in each run's window")
    p.add_argument("--rate", required=True)
    args = p.parse_args(argv)
    work, out = pathlib.Path(args.work), pathlib.Path(args.out)
    report = {"rate": args.rate, "window_steps": args.steps,
              "workers_per_machine": GROUP,
              "provenance": json.loads((work / "provenance.json").read_text()),
              "machines": {}}
    for mdir in sorted(work.iterdir(), key=lambda d: d.name):
        if not (mdir.is_dir() and mdir.name.isdigit()):
            continue
        n = int(mdir.name)
        rows = {}
        for row in ROWS:
            runs = [window(rd, n, args.steps)
                    for rd in sorted((mdir / row).glob("*"))
                    if (rd / "to").exists()]
            if runs:
                rows[row] = dict(summarize(runs), each=runs)
        report["machines"][str(n)] = {"rows": rows, "ratios": ratios(rows)}
    (out / "node_push.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "node_push.md").write_text(markdown(report))
    sys.stdout.write(markdown(report))


def markdown(report):
    prov = report["provenance"]
    lines = [
        "# One push per machine: bytes on each machine's link",
        "",
        "`tests/bench/node_push.sh` (report: `tests/bench/node_push_report.py`"
        f"): N machines x {report['workers_per_machine']} workers in network "
        f"namespaces, each link {report['rate']} both ways, the shards "
        "co-located (one per machine), train_gpt.py --size bench; figures "
        f"over the window of {report['window_steps']} steps after the freeze, "
        "medians over the runs. Commit "
        f"{prov['commit']}{' (dirty tree)' if prov.get('dirty') else ''}; "
        f"{prov['machine']['cpu']}, {prov['machine']['cores']} cores; "
        f"calibration {prov['calibration_seconds']:.3f} s. All namespaces "
        "share this one machine's cores: the CPU columns say where a row is "
        "CPU-bound (near the core count x its seconds per step).",
        ""]
    for n, m in report["machines"].items():
        lines += [f"## {n} machines", "",
                  "| row | runs | link MB/step (mean) | busiest | s/step "
                  "(range) | CPU s/step, a machine | all | final val loss |",
                  "|---|---|---|---|---|---|---|---|"]
        for row, r in m["rows"].items():
            losses = [e["final_val_loss"] for e in r["each"]
                      if e["final_val_loss"] is not None]
            lo, hi = r["seconds_per_step_range"]
            lines.append(
                f"| {row} | {r['runs']} | "
                f"{r['link_bytes_per_step_mean'] / 1e6:.3f} | "
                f"{r['link_bytes_per_step_busiest'] / 1e6:.3f} | "
                f"{r['seconds_per_step']:.3f} ({lo:.3f}-{hi:.3f}) | "
                f"{r['cpu_seconds_per_step_machine']:.3f} | "
                f"{r['cpu_seconds_per_step_all']:.3f} | "
                + (f"{statistics.median(losses):.4f}" if losses else "-")
                + " |")
        lines += ["", "| ratio | value | target | |", "|---|---|---|---|"]
        for q in m["ratios"]:
            lines.append(f"| {q['what']} | {q['value']:.2f} | {q['target']} "
                         f"| {'met' if q['met'] else 'MISSED'} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
