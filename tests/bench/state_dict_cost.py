"""What DistributedOptimizer.state_dict() / load_state_dict() cost: the
shards' whole state through a worker (issue 47), against torch.optim.AdamW's
own state_dict() + torch.save of the same model in the same run.

    /usr/bin/python3 tests/bench/state_dict_cost.py [--params 100000000]
        [--shards 2] [--repeats 3] [--json OUT]

Starts the shards (build/server/pserver_server, loopback), registers one
worker with a model of --params float32 parameters (1-bit Adam, one step so
the moments are not zero), then times, each --repeats times: state_dict()
(fetching every shard's state), torch.save of it to a file under /tmp, and
torch.load + load_state_dict() into a fresh job's shards (a new set of
shards, registered at step 0: the install path). Prints medians, the file's
bytes and bytes per parameter, and the same for AdamW. Figures depend on
the machine's memory bandwidth and loopback gRPC speed (../shared notes:
~0.5 GB/s for large unary messages).
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build" / "python"))

import torch  # noqa: E402

import pserver.torch  # noqa: E402


def start_shards(n, tmp, tag):
    binary = str(ROOT / "build" / "server" / "pserver_server")
    procs, addrs = [], []
    for i in range(n):
        port = pathlib.Path(tmp) / f"port.{tag}.{i}"
        procs.append(subprocess.Popen(
            [binary, f"--shard_index={i}", f"--num_shards={n}",
             "--num_workers=1", "--listen=127.0.0.1:0",
             f"--port_file={port}", "--metrics_listen=", "--drain_seconds=0",
             "--optimizer=onebit_adam", "--freeze_step=100"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while not port.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("pserver_server did not listen in 30 s")
            time.sleep(0.02)
        addrs.append(f"127.0.0.1:{port.read_text().strip()}")
    return procs, addrs


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = 1000
    w = torch.nn.Parameter(torch.randn(rows, args.params // rows) * 0.01)
    n = w.numel()
    figures = {"save": [], "torch_save": [], "load": [], "adamw_save": []}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        procs, addrs = start_shards(args.shards, tmp, "a")
        try:
            opt = pserver.torch.DistributedOptimizer(
                [w], servers=addrs, worker_id=0, num_workers=1,
                push_codec="onebit")
            w.grad = torch.randn_like(w) * 0.01
            opt.step()
            for r in range(args.repeats):
                sd, t = timed(opt.state_dict)
                figures["save"].append(t)
                _, t = timed(lambda: torch.save({"optimizer": sd}, path))
                figures["torch_save"].append(t)
                del sd
            file_bytes = os.path.getsize(path)
            del opt
        finally:
            stop(procs)
        for r in range(args.repeats):
            procs, addrs = start_shards(args.shards, tmp, f"b{r}")
            try:
                opt = pserver.torch.DistributedOptimizer(
                    [w], servers=addrs, worker_id=0, num_workers=1,
                    push_codec="onebit")

                def load():
                    opt.load_state_dict(torch.load(path)["optimizer"])
                _, t = timed(load)
                figures["load"].append(t)
                assert opt.global_step == 1
                del opt
            finally:
                stop(procs)
        # The baseline: torch.optim.AdamW's state_dict + torch.save.
        adamw = torch.optim.AdamW([w], lr=1e-3)
        adamw.step()
        for r in range(args.repeats):
            _, t = timed(lambda: torch.save({"optimizer": adamw.state_dict()},
                                            path))
            figures["adamw_save"].append(t)
        adamw_bytes = os.path.getsize(path)
    med = {k: statistics.median(v) for k, v in figures.items()}
    result = {
        "params": n, "shards": args.shards, "repeats": args.repeats,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": subprocess.run(["git", "-C", str(ROOT), "describe",
                                  "--always", "--dirty"],
                                 stdout=subprocess.PIPE, text=True
                                 ).stdout.strip(),
        "runs": figures, "medians": med,
        "file_bytes": file_bytes, "bytes_per_param": file_bytes / n,
        "file_gb": round(file_bytes / 1e9, 2),
        "adamw_file_bytes": adamw_bytes,
        "adamw_file_gb": round(adamw_bytes / 1e9, 2),
        "adamw_bytes_per_param": adamw_bytes / n,
        "save_total_over_adamw": (med["save"] + med["torch_save"])
        / med["adamw_save"],
    }
    print(f"{n} parameters, {args.shards} shards, medians of "
          f"{args.repeats}:")
    print(f"  state_dict() {med['save']:.2f} s + torch.save "
          f"{med['torch_save']:.2f} s; file {file_bytes / 1e9:.2f} GB "
          f"({file_bytes / n:.1f} B/parameter)")
    print(f"  torch.load + load_state_dict() into fresh shards "
          f"{med['load']:.2f} s")
    print(f"  AdamW state_dict + torch.save {med['adamw_save']:.2f} s; file "
          f"{adamw_bytes / 1e9:.2f} GB ({adamw_bytes / n:.1f} B/parameter); "
          f"save ratio {result['save_total_over_adamw']:.1f}x")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
