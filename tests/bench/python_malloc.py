#!/usr/bin/env python3
"""Which malloc a Python training process should run on (issue 29 §3).

pserver's daemons link tcmalloc (CMake's PSERVER_MALLOC); a Python worker
runs on whatever malloc the interpreter started with, glibc's unless the
user preloads another. This measures one worker process driving
pserver.torch.DistributedOptimizer on a synthetic model of PARAMS float32
parameters against one local shard (the build's pserver_server), per
allocator of the worker process:

  glibc      the interpreter as started
  glibc_env  glibc with MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ set
             (buffers stay in the heap instead of going back to the kernel)
  tcmalloc   LD_PRELOAD=libtcmalloc_minimal.so.4 (Debian libtcmalloc-minimal4)
  jemalloc   LD_PRELOAD=libjemalloc.so.2 (Debian libjemalloc2)

and prints, per allocator and codec, the median step time after the first
two steps and the worker's minor page faults per step (median), with the
machine's CPU beside them. Medians over --repeat runs. A variant whose
library is not installed is skipped with a note.

    PYTHONPATH=build/python /usr/bin/python3 tests/bench/python_malloc.py
    ... --params 50000000 --steps 8 --repeat 3 --codecs fp32 onebit
"""

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIB = pathlib.Path("/usr/lib/x86_64-linux-gnu")
VARIANTS = {
    "glibc": {},
    "glibc_env": {"MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                  "MALLOC_TRIM_THRESHOLD_": str(1 << 30)},
    "tcmalloc": {"LD_PRELOAD": str(LIB / "libtcmalloc_minimal.so.4")},
    "jemalloc": {"LD_PRELOAD": str(LIB / "libjemalloc.so.2")},
}


def child(args):
    """One worker: steps of DistributedOptimizer, a JSON line on stdout."""
    import torch
    import pserver.torch
    torch.manual_seed(0)
    n = args.params // 8
    params = [torch.nn.Parameter(torch.zeros(n)) for _ in range(8)]
    grads = [torch.randn(n) * 1e-3 for _ in params]
    opt = pserver.torch.DistributedOptimizer(
        params, servers=[args.server], worker_id=0, num_workers=1,
        push_codec=args.codec, warmup_codec=args.codec, lr=1e-3)
    steps, faults = [], []
    for _ in range(args.steps):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(json.dumps({"steps": steps, "faults": faults}))


def run_shard(server_bin, codec, work):
    port_file = work / f"port.{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [server_bin, "--num_workers=1", "--optimizer=adam",
         f"--pull_codec={codec}", "--listen=127.0.0.1:0", "--metrics_listen=",
         f"--port_file={port_file}"], stderr=subprocess.DEVNULL)
    for _ in range(600):
        if port_file.exists() and port_file.read_text().strip():
            return proc, f"127.0.0.1:{port_file.read_text().strip()}"
        time.sleep(0.05)
    proc.kill()
    sys.exit("python_malloc.py: the shard did not start in 30 s")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=int, default=50_000_000)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--codecs", nargs="+", default=["fp32", "onebit"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS),
                   choices=list(VARIANTS))
    p.add_argument("--server-bin", default=os.environ.get(
        "PSERVER_SERVER_BIN", str(ROOT / "build/server/pserver_server")))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    p.add_argument("--codec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.steps < 3:
        sys.exit("python_malloc.py: --steps must be at least 3 (two are "
                 "left out as warm-up)")
    if not os.access(args.server_bin, os.X_OK):
        sys.exit(f"python_malloc.py: no {args.server_bin}; build first")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores; {args.params} "
          f"parameters, 1 shard, 1 Python worker, {args.steps} steps, "
          f"{args.repeat} runs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pserver-pymalloc.") as tmp:
        work = pathlib.Path(tmp)
        for codec in args.codecs:
            for name in args.variants:
                extra = VARIANTS[name]
                pre = extra.get("LD_PRELOAD")
                if pre and not pathlib.Path(pre).exists():
                    print(f"{name}: {pre} is not installed; skipped")
                    continue
                per_run = []
                for _ in range(args.repeat):
                    shard, addr = run_shard(args.server_bin, codec, work)
                    try:
                        out = subprocess.run(
                            [sys.executable, __file__, "--child",
                             f"--server={addr}", f"--codec={codec}",
                             f"--params={args.params}",
                             f"--steps={args.steps}"],
                            env={**os.environ, **extra}, check=True,
                            capture_output=True, text=True, timeout=1800)
                    finally:
                        shard.terminate()
                        shard.wait(timeout=30)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    per_run.append((statistics.median(r["steps"][2:]),
                                    statistics.median(r["faults"][2:])))
                rows.append((codec, name,
                             statistics.median(s for s, _ in per_run),
                             statistics.median(f for _, f in per_run),
                             [round(s, 3) for s, _ in per_run]))
    print(f"{'codec':7s} {'malloc':10s} {'s/step':>8s} {'faults/step':>12s}"
          "  runs")
    for codec, name, step, faults, runs in rows:
        print(f"{codec:7s} {name:10s} {step:8.3f} {faults:12.0f}  {runs}")
    for codec in args.codecs:
        base = {n: s for c, n, s, _, _ in rows if c == codec}
        if "glibc" in base:
            print(f"{codec}: step time against glibc's: " + ", ".join(
                f"{n} {base['glibc'] / s:.2f}x" for n, s in base.items()))


if __name__ == "__main__":
    main()
