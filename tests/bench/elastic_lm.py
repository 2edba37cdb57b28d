#!/usr/bin/env python3
"""A language model trained while machines come and go (issue 48 item 3's
elastic measurement): does the loss end within the spread of runs whose
machines stay?

  /usr/bin/python3 tests/bench/elastic_lm.py [--seeds 1 2 3] [--results]

Every run: `pserver.launch --nnodes 2:3 --nproc-per-node 1 --recipe
lm-onebit:100`, launchers on this machine over loopback, train_gpt.py
--pserver --size bench --steps 450 --batch 12 (4 windows per worker:
WORLD_SIZE is 3 in every run). Nodes 0 and 1 start the job and host its
two shards; node 2 may join. fixed 2: nodes 0 and 1 alone. elastic: node 2
joins at round 150 (a third) and gets SIGTERM at round 300 (two thirds): 2,
then 3, then 2 workers. (Nodes 0 and 1 host the shards, so they cannot be
the one that leaves: the joiner leaves, not a third machine.) fixed 3:
node 2 started with the others, joining as soon as it is up (its first
rounds go without it). The same seeds for each. The
round's mean is over the workers present, so the elastic runs have a larger
batch in their middle third: they should end between fixed 2 and fixed 3.
Reported: rank 0's final validation loss per run, each kind's mean and
spread over seeds, and whether every elastic run ends inside fixed 2's
range (the issue's target) and between the two fixed kinds; checked: every launcher
exits 0, the leaver's worker left (not killed), and the shard logged the
join and the leave and no drop or skipped round. No Prometheus runs here
(the alert rules' handling of a planned leave is tests/e2e/prometheus/
alerts_test.yml's). --results writes tests/bench/results/elastic_lm.{md,json}
(a clean tree; tests/bench/provenance.py).
"""

import argparse
import json
import pathlib
import re
import signal
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import provenance  # noqa: E402
from elastic_membership import free_port, launcher, publish, wait  # noqa: E402


GPT = ROOT / "python" / "examples" / "train_gpt.py"
STEPS, JOIN_AT, LEAVE_AT = 450, 150, 300


def machine(build, tmp, rank, port, seed):
    return launcher(build, tmp, rank, port, "2:3", "--nproc-per-node", "1",
                    "--recipe", "lm-onebit:100", str(GPT), "--pserver",
                    "--size", "bench", "--steps", str(STEPS), "--batch", "12",
                    "--seed", str(seed), "--log-every", "10",
                    "--json", str(tmp / "rank0.json"))


def round_of(tmp):
    steps = re.findall(r"^step (\d+)/", (tmp / "launch0.log").read_text(),
                       re.M)
    return int(steps[-1]) if steps else 0


def one_run(build, seed, kind):
    elastic = kind == "elastic"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pserver-elastic-lm-"))
    port = free_port()
    procs = {r: machine(build, tmp, r, port, seed)
             for r in ((0, 1, 2) if kind == "fixed 3" else (0, 1))}
    start = time.monotonic()
    try:
        if elastic:
            wait("round 150", lambda: round_of(tmp) >= JOIN_AT, 900)
            procs[2] = machine(build, tmp, 2, port, seed)
            wait("round 300", lambda: round_of(tmp) >= LEAVE_AT, 900)
            procs[2].send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=1800)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    seconds = time.monotonic() - start
    log = (tmp / "run0" / "shard0.log").read_text()
    leaver = (tmp / "launch2.log").read_text() if elastic else ""
    checks = {"every launcher exited 0":
              all(p.returncode == 0 for p in procs.values()),
              "no worker dropped, no round skipped":
              "dropped" not in log and "skips from step" not in log}
    if elastic:
        checks["node 2 joined, then left (not dropped)"] = bool(
            re.search(r"worker 2 joins at step", log) and
            re.search(r"worker 2 left at step", log) and
            "left the job at step" in leaver)
    rec = json.loads((tmp / "rank0.json").read_text())
    return {"seed": seed, "kind": kind,
            "final_val_loss": rec["final_val_loss"], "seconds": seconds,
            "checks": checks, "run_dir": str(tmp)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--results", action="store_true")
    p.add_argument("--allow-dirty", action="store_true")
    a = p.parse_args()
    if a.results:
        provenance.require_clean(a.allow_dirty)
    prov = provenance.record()
    build = pathlib.Path(a.build)
    names = ("fixed 2", "elastic", "fixed 3")
    runs = [one_run(build, s, k) for s in a.seeds for k in names]
    kinds = {}
    for k in names:
        losses = [r["final_val_loss"] for r in runs if r["kind"] == k]
        kinds[k] = {"losses": losses, "mean": statistics.mean(losses),
                    "stdev": statistics.stdev(losses) if len(losses) > 1
                    else 0.0, "min": min(losses), "max": max(losses)}
    fixed, el, three = kinds["fixed 2"], kinds["elastic"], kinds["fixed 3"]
    inside = all(fixed["min"] <= x <= fixed["max"] for x in el["losses"])
    between = all(three["min"] <= x <= fixed["max"] for x in el["losses"])
    ok = all(all(r["checks"].values()) for r in runs)
    lines = ["# A language model while machines come and go "
             "(tests/bench/elastic_lm.py)", "",
             f"{provenance.describe([prov])}; seeds {a.seeds}; launchers on "
             "one 2-core machine over loopback; train_gpt.py --size bench, "
             f"{STEPS} rounds, lm-onebit:100, --nnodes 2:3 (node 2 is the "
             "one that joins and leaves).", "",
             "| run | workers | final val loss, per seed | mean ± stdev |",
             "|---|---|---|---|",
             *[f"| {k} | {w} | {', '.join(f'{x:.4f}' for x in kinds[k]['losses'])}"
               f" | {kinds[k]['mean']:.4f} ± {kinds[k]['stdev']:.4f} |"
               for k, w in (("fixed 2", "2"),
                            ("elastic", f"2, 3 from round {JOIN_AT}, 2 from "
                             f"round {LEAVE_AT}"), ("fixed 3", "3"))], "",
             f"Every elastic run inside fixed 2's range "
             f"[{fixed['min']:.4f}, {fixed['max']:.4f}] (the issue's "
             f"target): {'yes, met' if inside else 'no, missed'}. Every "
             f"elastic run between fixed 3's lowest and fixed 2's highest "
             f"[{three['min']:.4f}, {fixed['max']:.4f}]: "
             f"{'yes' if between else 'no'}.", "",
             "| check | every run |", "|---|---|"]
    checks = sorted({n for r in runs for n in r["checks"]})
    for n in checks:
        good = all(r["checks"][n] for r in runs if n in r["checks"])
        lines.append(f"| {n} | {'pass' if good else 'FAIL'} |")
    lines += ["", "Seconds per run (fixed 2, elastic, fixed 3 by seed): "
              + "; ".join(f"{r['seconds']:.0f}" for r in runs)]
    publish(lines, "elastic_lm" if a.results else None,
            {"provenance": prov, "kinds": kinds, "runs": runs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
