#!/usr/bin/env python3
"""Where a benchmark figure comes from (issue 49): the commit of a clean
tree (a dirty one is refused unless the caller allows it, and then said),
the machine, and a calibration figure of the machine: one fixed workload
timed the same way on every machine, so that runs from machines of
different speed are visible as such in a table.

  /usr/bin/python3 tests/bench/provenance.py [--allow-dirty]   # JSON on stdout

In Python:
  import provenance
  provenance.require_clean(allow_dirty)          # exits naming the files
  record = provenance.record()                   # into each result

The calibration is 200 products of two 256x256 float32 matrices in torch
on one thread, the median of 5 timings (about a second in all); it moves
with the CPU kind, its clock and what else runs, which is what it is for.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
_CALIBRATION = None


def tree(root=ROOT):
    """(commit, [files changed against it]); ("unknown", []) outside git."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse",
                                 "--short=12", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status",
                                 "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown", []
    return commit, [line[3:] for line in status.splitlines() if line.strip()]


def require_clean(allow_dirty, what="benchmark", root=ROOT):
    """Exits with one line when the tree has uncommitted changes to tracked
    files, unless allow_dirty (the results then say dirty)."""
    commit, changed = tree(root)
    if changed and not allow_dirty:
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        sys.exit(f"{what}: the tree at {commit} has uncommitted changes "
                 f"({shown}); commit them, or pass --allow-dirty and the "
                 "results say the runs came from a dirty tree")


def calibration():
    """Seconds of the fixed workload (cached for the process)."""
    global _CALIBRATION
    if _CALIBRATION is None:
        import torch
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            g = torch.Generator().manual_seed(0)
            a = torch.randn(256, 256, generator=g)
            b = torch.randn(256, 256, generator=g)
            times = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(200):
                    torch.mm(a, b)
                times.append(time.perf_counter() - t)
        finally:
            torch.set_num_threads(threads)
        _CALIBRATION = statistics.median(times)
    return _CALIBRATION


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // (1 << 20)
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem,
            "kernel": platform.release(),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}


def record(root=ROOT):
    commit, changed = tree(root)
    return {"commit": commit, "dirty": bool(changed),
            "machine": machine(), "calibration_seconds": calibration()}


def describe(records):
    """One line for a table: the commits (dirty said), the machines and the
    calibration range, and whether the runs mix machines (calibrations
    more than 10% apart)."""
    commits = sorted({r["commit"] + (" (dirty tree)" if r.get("dirty")
                                     else "") for r in records})
    cal = [r["calibration_seconds"] for r in records
           if r.get("calibration_seconds")]
    cpus = sorted({r["machine"]["cpu"] for r in records})
    line = f"commit {', '.join(commits)}; {', '.join(cpus)}"
    if cal:
        line += (f"; calibration {min(cal):.3f} to {max(cal):.3f} s"
                 if max(cal) > min(cal) else f"; calibration {cal[0]:.3f} s")
        if max(cal) > 1.1 * min(cal):
            line += (f" (the runs mix machines of different speed: "
                     f"{max(cal) / min(cal):.2f}x)")
    return line


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allow-dirty", action="store_true")
    a = p.parse_args()
    require_clean(a.allow_dirty, "provenance")
    print(json.dumps(record(), indent=1))


if __name__ == "__main__":
    main()
