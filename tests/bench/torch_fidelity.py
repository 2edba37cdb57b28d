#!/usr/bin/python3
"""PyTorch fidelity benchmark (not a unit test): pserver against what PyTorch
users run today, on the two example models of python/examples/.

Workloads (4 workers, the examples' data and batch schemes):
  cnn          fashion_cnn.py's CNN on Fashion-MNIST, batch 32 per worker,
               EPOCHS epochs (default 3); test accuracy.
  transformer  char_transformer.py's character-level transformer on the
               Python standard library's source, batch 8 per worker,
               TRANSFORMER_STEPS steps (default 200); validation loss.

Runs, for each workload and seed (the same initial weights: torch's seed,
and the same batches in the same order in every run):
  torch_adam     torch.optim.Adam in one process on the global batch (W x b
                 examples), i.e. on the mean of the workers' gradients: the
                 reference the fp32 pserver run must equal.
  torch_adam_split  the same, but the gradient is the mean of the W workers'
                 own batch gradients, summed in worker order and divided by W
                 (what the shards compute): the same arithmetic up to
                 rounding, so its distance from torch_adam is the noise floor
                 of "the same accuracy".
  ps_adam_fp32   pserver, Adam with bias correction on the shards (as
                 torch.optim.Adam), fp32 pushes and pulls.
  ps_onebit      pserver, 1-bit Adam, 1-bit pushes and pulls (bf16 pushes
                 during the warmup); the transformer with bias correction.
  ps_onebit_wm   ps_onebit with --onebit_momentum=worker: the workers'
                 momentum is compressed after the freeze, not the gradient.
  ps_topk        pserver, 1-bit Adam's schedule with TopK pushes and pulls.
  ddp_fp32       DistributedDataParallel over gloo, 4 processes, fp32
                 allreduce, torch.optim.Adam.
  ddp_fp16       the same with fp16_compress_hook.
  ddp_powersgd   the same with powerSGD_hook (rank 4), in one DDP bucket
                 (with several, gloo ranks may order PowerSGD's chained
                 allreduces differently and abort).

Bytes per worker: pserver's from the client's own counters (encoded payload
pushed, pulled, and the frozen variance fetched once; framing not counted).
DDP's are counted: every allreduce its hook issues is intercepted and its
tensor bytes x 2(N-1)/N (a ring allreduce's send volume per rank, received
likewise) are added up, so fp32 DDP goes through default_hooks.allreduce_hook
(the same arithmetic as DDP's built-in allreduce, but countable).

  tests/bench/torch_fidelity.sh                        # everything, seeds 1 2 3
  SEEDS=1 WORKLOADS=cnn RUNS="torch_adam ps_adam_fp32" tests/bench/torch_fidelity.sh

Writes RESULTS/torch_fidelity.{md,json,svg} (RESULTS: tests/bench/results by
default with --results, else results/torch_fidelity).
"""

import argparse
import datetime
import json
import math
import os
import pathlib
import shlex
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "python" / "examples"
sys.path.insert(0, str(EXAMPLES))

WORKERS = 4
RUN_NAMES = ["torch_adam", "torch_adam_split", "ps_adam_fp32", "ps_onebit",
             "ps_onebit_wm", "ps_topk", "ddp_fp32",
             "ddp_fp16", "ddp_powersgd"]


# ---------------------------------------------------------------------------
# Workloads: model, batches and the score, shared by the one-process and DDP
# runs (the pserver runs are the example scripts themselves).

class Cnn:
    name = "cnn"
    metric = "test_accuracy"

    def __init__(self, args):
        import fashion_cnn
        from train_mlp import load
        self.m = fashion_cnn
        self.batch = 32
        self.x, self.y = load(args.data_dir, "train", args.train_subset)
        self.xt, self.yt = load(args.data_dir, "t10k", args.test_subset)
        self.per_epoch = len(self.x) // (WORKERS * self.batch)
        self.steps = args.steps or args.epochs * self.per_epoch
        self.seed = args.seed

    def model(self):
        torch.manual_seed(self.seed)
        return self.m.Net()

    def loss(self, net, step, rank, world, batch):
        idx = self.m.batch_indices(len(self.x), self.seed, step,
                                   self.per_epoch, world, rank, batch)
        return torch.nn.functional.cross_entropy(net(self.x[idx]), self.y[idx])

    def score(self, net):
        acc, loss = self.m.evaluate(net, self.xt, self.yt)
        return {"test_accuracy": acc, "test_loss": loss}


class Transformer:
    name = "transformer"
    metric = "val_loss"

    def __init__(self, args):
        import char_transformer
        self.m = char_transformer
        self.batch = 8
        self.context = 128
        self.train, self.val = char_transformer.load_corpus()
        self.steps = args.steps or args.transformer_steps
        self.seed = args.seed

    def model(self):
        torch.manual_seed(self.seed)
        return self.m.CharTransformer(context=self.context)

    def loss(self, net, step, rank, world, batch):
        x, y = self.m.get_batch(self.train, step, rank, world, batch,
                                self.context, self.seed)
        logits = net(x)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def score(self, net):
        return {"val_loss": self.m.evaluate(net, self.val, self.context)}


WORKLOADS = {"cnn": Cnn, "transformer": Transformer}


# ---------------------------------------------------------------------------
# torch_adam: one process, the global batch.

def run_torch_adam(args, split=False):
    torch.set_num_threads(args.threads)
    w = WORKLOADS[args.workload](args)
    net = w.model()
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    start = time.monotonic()
    for step in range(w.steps):
        if split:
            # .grad accumulates worker 0's, then 1's, ... gradient; then / W.
            for rank in range(WORKERS):
                w.loss(net, step, rank, WORKERS, w.batch).backward()
            with torch.no_grad():
                for p in net.parameters():
                    p.grad.mul_(1.0 / WORKERS)
        else:
            w.loss(net, step, 0, 1, WORKERS * w.batch).backward()
        opt.step()
        opt.zero_grad()
    seconds = time.monotonic() - start
    return dict(w.score(net), steps=w.steps, seconds=seconds,
                bytes_up=0, bytes_down=0,
                parameters=sum(p.numel() for p in net.parameters()))


# ---------------------------------------------------------------------------
# DDP: 4 processes over gloo on loopback, every allreduce counted.

def _ddp_rank(rank, args, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORKERS,
                            timeout=datetime.timedelta(seconds=600))
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    import ddp_bytes
    counted = ddp_bytes.count_allreduces()

    w = WORKLOADS[args.workload](args)
    net = w.model()  # the same seed on every rank: the same initial weights
    # gloo cannot broadcast bool buffers (the transformer's causal mask);
    # buffers are computed alike on every rank, so none needs syncing.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        net, [name for name, b in net.named_buffers()
              if b.dtype == torch.bool])
    if args.hook == "powersgd":
        # One bucket: PowerSGD chains three allreduces per bucket, and with
        # several buckets in flight gloo ranks can issue them in different
        # orders (the transformer's 1.9M parameters made two buckets, the
        # first of DDP's 1 MB first-bucket size, and gloo aborted: "enforce
        # fail at pair.cc:510 op.preamble.length <= op.nbytes").
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        ddp = DistributedDataParallel(net, bucket_cap_mb=1024)
    else:
        ddp = DistributedDataParallel(net)
    if args.hook == "fp32":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif args.hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=args.powersgd_start, random_seed=args.seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    start = time.monotonic()
    for step in range(w.steps):
        loss = w.loss(ddp, step, rank, WORKERS, w.batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    seconds = time.monotonic() - start
    ring = 2 * (WORKERS - 1) / WORKERS
    sent = int(counted.bytes * ring)
    if rank == 0:
        result = dict(w.score(net), steps=w.steps, seconds=seconds,
                      bytes_up=sent, bytes_down=sent,
                      allreduce_bytes=counted.bytes,
                      parameters=sum(p.numel() for p in net.parameters()))
        with open(out, "w") as f:
            json.dump(result, f)
    import train_gpt  # python/examples, on sys.path
    del ddp  # the DDP wrapper first (train_gpt.end_ddp says why)
    train_gpt.end_ddp()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(args, work):
    out = os.path.join(work, "ddp.json")
    mp.spawn(_ddp_rank, args=(args, free_port(), out), nprocs=WORKERS)
    with open(out) as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# pserver: the launcher runs the example script on real shards.

def pserver_flags(name, args, workload):
    """(launcher's shard flags, the script's flags) of a pserver run."""
    shard, script = _pserver_flags(name, args, workload)
    if workload == "transformer" and name != "ps_adam_fp32":
        # Without bias correction Adam's first steps are several times lr
        # and the transformer stalls near 3.0 nats per byte (the example's
        # docstring); the CNN keeps 1-bit Adam's DeepSpeed form.
        shard.append("--bias_correction=true")
    if name != "ps_adam_fp32":
        # --shard-flags: extra daemon flags for the compressed runs (e.g.
        # --compression_beta1=0.5); the launcher passes them to the shards.
        shard.extend(shlex.split(args.shard_flags))
    return shard, script


def _pserver_flags(name, args, workload):
    freeze = args.freeze_step if workload == "cnn" else args.transformer_freeze_step
    if name == "ps_adam_fp32":
        return (["--optimizer", "adam", "--bias_correction=true",
                 "--pull-codec", "fp32"],
                ["--push-codec", "fp32", "--warmup-codec", "fp32"])
    if name in ("ps_onebit", "ps_onebit_wm"):
        return (["--optimizer", "onebit_adam", "--freeze-step", str(freeze),
                 "--pull-codec", "onebit"] +
                (["--onebit_momentum=worker"] if name == "ps_onebit_wm" else []),
                ["--push-codec", "onebit", "--warmup-codec", "bf16"])
    if name == "ps_topk":
        return (["--optimizer", "onebit_adam", "--freeze-step", str(freeze),
                 "--pull-codec", "topk", "--pull-k-fraction",
                 str(args.k_fraction)],
                ["--push-codec", "topk", "--warmup-codec", "bf16"])
    raise ValueError(name)


def run_pserver(name, args, work):
    shard_flags, script_flags = pserver_flags(name, args, args.workload)
    out = os.path.join(work, "result.json")
    script = "fashion_cnn.py" if args.workload == "cnn" else "char_transformer.py"
    if args.workload == "cnn":
        steps = (["--steps", str(args.steps)] if args.steps else
                 ["--epochs", str(args.epochs)]) + [
            "--train-subset", str(args.train_subset),
            "--test-subset", str(args.test_subset),
            "--k-fraction", str(args.k_fraction)]
    else:
        steps = ["--steps", str(args.steps or args.transformer_steps),
                 "--k-fraction", str(args.k_fraction)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(args.package_root), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pserver.launch", "--server-bin",
           args.server_bin, "--run-dir", os.path.join(work, "run"),
           "--shards", "2", "--workers", str(WORKERS), "--lr", str(args.lr),
           *shard_flags, str(EXAMPLES / script), "--seed", str(args.seed),
           *script_flags, *steps, "--result-json", out]
    with open(os.path.join(work, "launch.log"), "w") as log:
        p = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise RuntimeError(f"{name}: the launcher exited {p.returncode}; see "
                           f"{work}/launch.log and {work}/run/")
    with open(out) as f:
        r = json.load(f)
    r["bytes_up"] = r["push_payload_bytes"]
    r["bytes_down"] = r["pull_payload_bytes"] + r.get("variance_payload_bytes", 0)
    return r


# ---------------------------------------------------------------------------
# The report.

def summarise(results, workload):
    """Per run name: mean/std/min/max of the metric over seeds, mean bytes."""
    metric = WORKLOADS[workload].metric
    rows = []
    for name in RUN_NAMES:
        rs = [r for r in results if r["workload"] == workload and r["run"] == name]
        if not rs:
            continue
        vals = [r[metric] * (100 if metric == "test_accuracy" else 1) for r in rs]
        rows.append({
            "run": name, "n": len(rs), "mean": statistics.mean(vals),
            "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "values": vals,
            "seeds": [r["seed"] for r in rs],
            "mb_up": statistics.mean(r["bytes_up"] for r in rs) / 1e6,
            "mb_down": statistics.mean(r["bytes_down"] for r in rs) / 1e6,
            "seconds": statistics.mean(r["seconds"] for r in rs),
        })
    return rows


def markdown(results, args):
    out = []
    for workload in args.workloads:
        rows = summarise(results, workload)
        if not rows:
            continue
        metric = "test accuracy %" if workload == "cnn" else "validation loss (nats/char)"
        out.append(f"## {workload}\n")
        out.append(f"| run | {metric} (mean) | std | min..max | per seed | "
                   "MB up / worker | MB down / worker | MB total / worker | "
                   "less traffic than fp32 | wall s |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        ref = next((r for r in rows if r["run"] == "ps_adam_fp32"), None)
        for r in rows:
            total = r["mb_up"] + r["mb_down"]
            ratio = (f"{(ref['mb_up'] + ref['mb_down']) / total:.1f}x"
                     if ref and total > 0 else "n/a")
            fmt = "{:.2f}" if workload == "cnn" else "{:.4f}"
            out.append("| {} | {} | {} | {}..{} | {} | {:.1f} | {:.1f} | {:.1f} | {} | {:.0f} |".format(
                r["run"], fmt.format(r["mean"]), fmt.format(r["std"]),
                fmt.format(r["min"]), fmt.format(r["max"]),
                " / ".join(fmt.format(v) for v in r["values"]),
                r["mb_up"], r["mb_down"], total, ratio, r["seconds"]))
        out.append("")
        out += verdicts(rows, workload)
        out.append("")
    out.append(settings_text(args))
    return "\n".join(out) + "\n"


def verdicts(rows, workload):
    by = {r["run"]: r for r in rows}
    lines = []

    def total(r):
        return r["mb_up"] + r["mb_down"]
    ta, pa = by.get("torch_adam"), by.get("ps_adam_fp32")
    for name in ("ps_adam_fp32", "torch_adam_split"):
        r = by.get(name)
        if not (ta and r):
            continue
        if workload == "cnn":
            d = r["mean"] - ta["mean"]
            if name == "ps_adam_fp32":
                target = "; target within 0.1 point: " + (
                    "met" if abs(d) <= 0.1 else "MISSED")
            else:
                target = " (rounding alone)"
            lines.append(f"- {name} vs torch_adam: {d:+.2f} points{target}")
        else:
            lines.append(f"- {name} vs torch_adam: "
                         f"{100 * (r['mean'] / ta['mean'] - 1):+.2f}% validation "
                         f"loss{' (rounding alone)' if name != 'ps_adam_fp32' else ''}")
    for name in ("ps_onebit", "ps_onebit_wm", "ps_topk", "ddp_fp16",
                 "ddp_powersgd"):
        r = by.get(name)
        if not (r and pa):
            continue
        less = total(pa) / total(r) if total(r) > 0 else float("inf")
        if workload == "cnn":
            d = r["mean"] - pa["mean"]
            met = ""
            if name.startswith("ps_onebit"):
                met = "; target within 0.3 point and >= 15x: " + (
                    "met" if d >= -0.3 and less >= 15 else "MISSED")
            lines.append(f"- {name}: {d:+.2f} points vs ps_adam_fp32, {less:.1f}x less traffic{met}")
        else:
            d = 100 * (r["mean"] / pa["mean"] - 1)
            met = ""
            if name.startswith("ps_onebit"):
                met = "; target within 2%: " + ("met" if d <= 2 else "MISSED")
            lines.append(f"- {name}: validation loss {d:+.2f}% vs ps_adam_fp32, "
                         f"{less:.1f}x less traffic{met}")
    return lines


def settings_text(args):
    return (f"Seeds {' '.join(map(str, args.seeds))}; {WORKERS} workers; pserver "
            f"with 2 shards (python3 -m pserver.launch), lr {args.lr}; cnn: "
            f"{args.epochs} epochs of batch 32 per worker, 1-bit Adam freeze "
            f"step {args.freeze_step}; transformer: {args.transformer_steps} "
            f"steps of batch 8 x 128 characters per worker, freeze step "
            f"{args.transformer_freeze_step}, every pserver run with Adam's "
            f"bias correction; TopK k = {args.k_fraction} both "
            f"ways; PowerSGD rank {args.powersgd_rank} from step "
            f"{args.powersgd_start}"
            + (f"; compressed runs' shard flags: {args.shard_flags}"
               if args.shard_flags else "") +
            ". MB: 10^6 bytes per worker over the whole "
            "run. pserver bytes: encoded payloads the client counted (pushes; "
            "pulls plus the frozen variance), framing not counted. DDP bytes: "
            "every allreduce its comm hook issued x 2(N-1)/N, each way. The "
            "machine has 2 cores shared by all processes: wall times compare "
            "CPU, not networks.")


def svg(results, workload):
    rows = summarise(results, workload)
    if not rows:
        return ""
    W, H, L, R, T, B = 680, 420, 80, 660, 20, 370
    acc = workload == "cnn"
    xs = [max(r["mb_up"] + r["mb_down"], 1e-3) for r in rows]
    lx0, lx1 = math.log10(min(xs) / 2), math.log10(max(xs) * 2)
    lo = min(r["min"] for r in rows)
    hi = max(r["max"] for r in rows)
    pad = (hi - lo) * 0.15 or 0.5
    lo, hi = lo - pad, hi + pad

    def X(mb):
        return L + (math.log10(max(mb, 1e-3)) - lx0) / (lx1 - lx0) * (R - L)

    def Y(v):
        return B - (v - lo) / (hi - lo) * (B - T)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 30}" '
         'font-family="sans-serif" font-size="12">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<line x1="{L}" y1="{B}" x2="{R}" y2="{B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{B}" stroke="black"/>']
    for e in range(math.floor(lx0), math.ceil(lx1) + 1):
        x = L + (e - lx0) / (lx1 - lx0) * (R - L)
        if L <= x <= R:
            s.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{B}" stroke="#ddd"/>')
            s.append(f'<text x="{x:.1f}" y="{B + 18}" text-anchor="middle">{10.0 ** e:g} MB</text>')
    for i in range(6):
        v = lo + (hi - lo) * i / 5
        y = Y(v)
        s.append(f'<line x1="{L}" y1="{y:.1f}" x2="{R}" y2="{y:.1f}" stroke="#eee"/>')
        s.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    ylabel = "test accuracy %" if acc else "validation loss (lower is better)"
    s.append(f'<text x="{(L + R) // 2}" y="{H + 10}" text-anchor="middle">total bytes '
             'up+down per worker (log scale); bar: min..max over seeds</text>')
    s.append(f'<text x="16" y="{(T + B) // 2}" transform="rotate(-90 16 {(T + B) // 2})" '
             f'text-anchor="middle">{ylabel}</text>')
    for r in rows:
        x = X(r["mb_up"] + r["mb_down"])
        color = "#d62728" if r["run"].startswith("ddp") else (
            "#2ca02c" if r["run"] == "torch_adam" else "#1f77b4")
        s.append(f'<line x1="{x:.1f}" y1="{Y(r["min"]):.1f}" x2="{x:.1f}" '
                 f'y2="{Y(r["max"]):.1f}" stroke="{color}"/>')
        for v in r["values"]:
            s.append(f'<circle cx="{x:.1f}" cy="{Y(v):.1f}" r="3" fill="none" stroke="#ff7f0e"/>')
        s.append(f'<circle cx="{x:.1f}" cy="{Y(r["mean"]):.1f}" r="5" fill="{color}"/>')
        right = x > (L + R) / 2
        s.append(f'<text x="{x - 8 if right else x + 8:.1f}" y="{Y(r["mean"]) - 6:.1f}" '
                 f'text-anchor="{"end" if right else "start"}">{r["run"]} '
                 f'({r["mean"]:.{2 if acc else 3}f})</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


# ---------------------------------------------------------------------------

def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=["cnn", "transformer"],
                   choices=sorted(WORKLOADS))
    p.add_argument("--runs", nargs="+", default=RUN_NAMES, choices=RUN_NAMES)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--epochs", type=int, default=2, help="cnn")
    p.add_argument("--transformer-steps", type=int, default=200)
    p.add_argument("--steps", type=int, default=0,
                   help="every workload: this many steps (a quick look)")
    p.add_argument("--train-subset", type=int, default=0, help="cnn")
    p.add_argument("--test-subset", type=int, default=0, help="cnn")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--freeze-step", type=int, default=100, help="cnn, 1-bit Adam")
    p.add_argument("--transformer-freeze-step", type=int, default=50)
    p.add_argument("--k-fraction", type=float, default=0.01)
    p.add_argument("--shard-flags", default="",
                   help="extra pserver_server flags for the compressed runs "
                        "(ps_onebit, ps_onebit_wm, ps_topk), one string")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--powersgd-start", type=int, default=10)
    p.add_argument("--threads", type=int, default=2, help="torch_adam's threads")
    p.add_argument("--server-bin", default=str(ROOT / "build/server/pserver_server"))
    p.add_argument("--package-root", default=str(ROOT / "build/python"))
    p.add_argument("--out", default=str(ROOT / "results/torch_fidelity"))
    p.add_argument("--work", default="",
                   help="each run's logs and files (default OUT/runs)")
    p.add_argument("--from-json", nargs="+", default=[], metavar="FILE",
                   help="run nothing: report the runs these torch_fidelity.json "
                        "files hold (e.g. workloads measured separately)")
    a = p.parse_args()
    if a.from_json:
        return a
    if not os.access(a.server_bin, os.X_OK):
        p.error(f"--server-bin {a.server_bin} is not an executable "
                "(build first: tests/run.sh or ninja -C build pserver_server_bin pserver_python)")
    return a


def main():
    args = parse()
    # The examples import pserver; DDP's spawned ranks inherit PYTHONPATH.
    sys.path.insert(0, args.package_root)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [args.package_root, os.environ.get("PYTHONPATH", "")])
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work_root = pathlib.Path(args.work) if args.work else out / "runs"
    work_root.mkdir(parents=True, exist_ok=True)
    results = []
    if args.from_json:
        for path in args.from_json:
            results += json.loads(pathlib.Path(path).read_text())
        args.workloads = [w for w in WORKLOADS
                          if any(r["workload"] == w for r in results)]
        args.seeds = sorted({r["seed"] for r in results})
        args.runs = []
    for workload in args.workloads:
        for name in args.runs:
            for seed in args.seeds:
                a = argparse.Namespace(**vars(args), workload=workload, seed=seed,
                                       hook=name[4:] if name.startswith("ddp_") else None)
                work = work_root / f"{workload}-{name}-seed{seed}"
                work.mkdir(parents=True, exist_ok=True)
                print(f"torch_fidelity: {workload} {name} seed {seed} ...",
                      file=sys.stderr, flush=True)
                if name.startswith("torch_adam"):
                    r = run_torch_adam(a, split=name == "torch_adam_split")
                elif name.startswith("ddp_"):
                    r = run_ddp(a, str(work))
                else:
                    r = run_pserver(name, a, str(work))
                r.update(workload=workload, run=name, seed=seed, settings={
                    k: getattr(args, k) for k in (
                        "epochs", "transformer_steps", "steps", "freeze_step",
                        "transformer_freeze_step", "k_fraction", "lr",
                        "powersgd_rank", "powersgd_start", "train_subset",
                        "test_subset", "shard_flags")})
                results.append(r)
                metric = WORKLOADS[workload].metric
                print(f"torch_fidelity: {workload} {name} seed {seed}: "
                      f"{metric} {r[metric]:.4f}, {r['bytes_up'] / 1e6:.1f} MB up "
                      f"{r['bytes_down'] / 1e6:.1f} MB down per worker, "
                      f"{r['seconds']:.0f} s", file=sys.stderr, flush=True)
                # Partial results survive an interrupted run.
                (out / "torch_fidelity.json").write_text(json.dumps(results, indent=1))
    (out / "torch_fidelity.json").write_text(json.dumps(results, indent=1))
    if args.from_json:
        # The settings line speaks of the runs' own settings.
        # Each workload's own keys from its own runs (a run records the
        # other workload's defaults too).
        only = {"epochs": "cnn", "freeze_step": "cnn",
                "transformer_steps": "transformer",
                "transformer_freeze_step": "transformer"}
        for key in ("epochs", "transformer_steps", "freeze_step",
                    "transformer_freeze_step", "k_fraction", "lr",
                    "powersgd_rank", "powersgd_start"):
            seen = {r["settings"][key] for r in results if "settings" in r
                    and r["workload"] == only.get(key, r["workload"])}
            if len(seen) == 1:
                setattr(args, key, seen.pop())
    md = markdown(results, args)
    (out / "torch_fidelity.md").write_text(md)
    for workload in args.workloads:
        pic = svg(results, workload)
        if pic:
            (out / f"torch_fidelity_{workload}.svg").write_text(pic)
    print(md)
    print(f"torch_fidelity: wrote {out}/torch_fidelity.md, .json, _*.svg",
          file=sys.stderr)


if __name__ == "__main__":
    main()
