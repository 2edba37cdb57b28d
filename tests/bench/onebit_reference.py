#!/usr/bin/python3
"""Single-process model of the shards' 1-bit Adam, for attribution (not a test).

Where does 1-bit Adam lose accuracy against Adam: the frozen variance, the
pushes' codec or the pulls' codec? The cluster cannot switch one of them off
alone (an exact pull means fp32 pulls, which also changes the replica
tracking), and at this workload a single run moves by a few tenths with any
change, so each question needs 8 seeds or more. This script models what
the shards and workers compute, on the reference workload of
tests/bench/fidelity.sh, with every part switchable:

  - pserver's initial weights and batches for a seed (torch_reference.py
    --recipe pserver), W workers each taking its slice of the global batch
    of 128 (worker w: examples [32 w, 32 w + 32) with 4 workers);
  - until --freeze_step: Adam on the mean gradient without bias correction,
    eps outside the square root (the shards' default);
  - the freeze as the shards' robust mode (server/moment_optimizer.cc):
    sqrt(v) floored per tensor at --variance_floor times its mean, the
    shard's momentum moved into the preconditioned space;
  - after it, as --onebit_momentum=worker: each worker's momentum of its
    preconditioned gradients (zero at the freeze) is pushed through the
    codec with error feedback; the shard adds the mean of the decoded pushes
    to its own decaying momentum and steps; the pull sends the codec of the
    weights' difference from the workers' replica (replica tracking), on
    which the next gradients are computed (with fp32 pulls, the weights
    themselves, as the shards send them).

Codecs: fp32; onebit (blocks of --block_size for pushes and
--pull_block_size for pulls, scale mean |u|, as
common/impl/onebit_kernels.cc); onebit_rotated (the same after a random
rotation of each block: random signs, then an orthonormal Walsh-Hadamard
transform, fresh for every message, as in DRIVE, Vargaftik et al. 2021; not
a pserver codec); quantize (--bits, min/max per block of 1024, round to
nearest). --push_feedback=ef21 replaces error feedback on
the pushes with EF21 (Richtarik et al. 2021: the worker sends the codec of
its momentum's difference from an estimate both sides keep); --ef_decay
scales the pushes' residual each round, as pserver_worker --ef_decay.
--compression_beta1 sets the momentum's decay after the freeze (the
workers' momenta and the shard's decaying one; 0.9 before it), as
pserver_server --compression_beta1. --variance_change_every=K reports how
much sqrt(v) (bias-corrected) moved over each K steps before the freeze,
relative in L1: the signal an adaptive freeze (0/1 Adam's "freeze when v
stops changing") would use.
--local_steps=H > 1 after the freeze (as 0/1 Adam, Lu et al. 2022, syncs
less often): each worker steps its own copy of the replica with its own
momentum for H steps and then pushes the change (error feedback as above);
the shard applies the mean change and its decaying momentum, and the pull
follows once per round.

The model is not the cluster: it sums in other orders, omits the warmup's
codec (the fidelity recipes push 8-bit values during the warmup) and blocks
the whole flat vector rather than each shard's slice, so single seeds
differ from pserver's; what it is for is means over many seeds. On seeds
1-8, --optimizer onebit_adam with 1-bit pushes and pulls gave 87.40, as
pserver's onebit_b09 runs (87.40; tests/bench/results/onebit_reference.md
and fidelity_8seeds.md).

  /usr/bin/python3 tests/bench/onebit_reference.py --seeds 1 2 3 4 5 6 7 8
  /usr/bin/python3 tests/bench/onebit_reference.py --push fp32 --pull fp32
  /usr/bin/python3 tests/bench/onebit_reference.py --optimizer adam
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import torch_reference as ref

DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 128


def onebit(u, block):
    n = u.numel()
    w = torch.cat([u, u.new_zeros((-n) % block)]).view(-1, block)
    s = w.abs().mean(1, keepdim=True)
    return torch.where(w >= 0, s, -s).view(-1)[:n]


def quantize(u, bits, block=1024):
    n = u.numel()
    w = torch.cat([u, u.new_zeros((-n) % block)]).view(-1, block)
    lo = w.min(1, keepdim=True).values
    hi = w.max(1, keepdim=True).values
    step = (hi - lo).clamp(min=1e-30) / ((1 << bits) - 1)
    return (torch.round((w - lo) / step) * step + lo).view(-1)[:n]


def hadamard(size):
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h / size ** 0.5


def onebit_rotated(u, block, h, gen):
    n = u.numel()
    w = torch.cat([u, u.new_zeros((-n) % block)]).view(-1, block)
    flip = torch.randint(0, 2, w.shape, generator=gen).float() * 2 - 1
    r = (w * flip) @ h
    s = r.abs().mean(1, keepdim=True)
    return ((torch.where(r >= 0, s, -s) @ h) * flip).view(-1)[:n]


def codec(name, bits, block, gen):
    if name == "onebit_rotated":
        h = hadamard(block)
        return lambda u: onebit_rotated(u, block, h, gen)
    if name == "fp32":
        return lambda u: u.clone()
    if name == "onebit":
        return lambda u: onebit(u, block)
    return lambda u: quantize(u, bits)


def run(args, seed, train, test):
    model = ref.mlp()
    ref.pserver_init(model, seed, "pytorch")
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    x = parameters_to_vector(params).detach().clone()
    n = x.numel()
    m, v = torch.zeros(n), torch.zeros(n)
    b1, b2, lr, eps = 0.9, 0.999, args.lr, 1e-8
    gen = torch.Generator().manual_seed(seed)  # onebit_rotated's rotations
    push = codec(args.push, args.bits, args.block_size, gen)
    pull = codec(args.pull, args.pull_bits, args.pull_block_size, gen)
    H = args.local_steps
    W = args.workers
    per_worker = BATCH // W
    X, Y = train
    steps_per_epoch = X.shape[0] // BATCH
    frozen = False
    step = 0
    total = args.epochs * steps_per_epoch
    root_then, changes = None, []

    def fed_back(w, value):
        # Worker w's push of value with error feedback: what the shard gets.
        sent = push(value + e[w])
        e[w] = (value + e[w] - sent) * args.ef_decay
        return sent

    def gradient(at, rows):
        vector_to_parameters(at, params)
        loss = F.cross_entropy(model(X[rows]), Y[rows])
        for p in params:
            p.grad = None
        loss.backward()
        return parameters_to_vector([p.grad for p in params])

    for epoch in range(args.epochs):
        perm = ref.pserver_permutation(X.shape[0], seed, epoch)
        for b in range(steps_per_epoch):
            rows = perm[b * BATCH:(b + 1) * BATCH]
            if not frozen:
                g = gradient(x, rows)
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                x.addcdiv_(m, v.sqrt().add_(eps), value=-lr)
                step += 1
                if args.variance_change_every and \
                        step % args.variance_change_every == 0:
                    # How much the (bias-corrected) sqrt(v) moved since the
                    # last report, relative in L1: what an adaptive freeze
                    # ("freeze when v stops changing") would watch.
                    root_now = (v / (1 - b2 ** step)).sqrt()
                    if root_then is not None:
                        change = ((root_now - root_then).abs().sum() /
                                  root_then.sum()).item()
                        changes.append((step, change))
                    root_then = root_now
                if args.optimizer == "onebit_adam" and step == args.freeze_step:
                    frozen = True
                    root = v.sqrt()
                    for seg in root.split(sizes):
                        seg.clamp_(min=args.variance_floor * seg.mean().item())
                    d = 1.0 / (root + eps)  # the workers' preconditioner
                    m.mul_(d)                # the shard's momentum, decaying
                    u = [torch.zeros(n) for _ in range(W)]    # workers' momenta
                    e = [torch.zeros(n) for _ in range(W)]    # residuals / EF21 estimates
                    replica = x.clone()
                    b1 = args.compression_beta1
                continue
            if H > 1:
                # 0/1 Adam-style local steps: the workers' own copies.
                if (step - args.freeze_step) % H == 0:
                    local = [replica.clone() for _ in range(W)]
                for w in range(W):
                    g = gradient(local[w],
                                 rows[w * per_worker:(w + 1) * per_worker])
                    u[w].mul_(b1).add_(g * d, alpha=1 - b1)
                    local[w].add_(u[w], alpha=-lr)
                m.mul_(b1)
                x.add_(m, alpha=-lr)
                step += 1
                if (step - args.freeze_step) % H and step != total:
                    continue
                mean = torch.zeros(n)
                for w in range(W):
                    change = (replica - local[w]) / lr
                    mean += fed_back(w, change)
                x.add_(mean / W, alpha=-lr)
            else:
                mean = torch.zeros(n)
                for w in range(W):
                    g = gradient(replica,
                                 rows[w * per_worker:(w + 1) * per_worker])
                    u[w].mul_(b1).add_(g * d, alpha=1 - b1)
                    if args.push_feedback == "ef21":
                        e[w] += push(u[w] - e[w])
                        mean += e[w]
                    else:
                        mean += fed_back(w, u[w])
                m.mul_(b1)
                x.add_(m + mean / W, alpha=-lr)
                step += 1
            if args.pull == "fp32":
                replica = x.clone()  # fp32 pulls send the weights themselves
            else:
                replica += pull(x - replica)
    vector_to_parameters(replica if frozen else x, params)
    with torch.no_grad():
        acc = (model(test[0]).argmax(1) == test[1]).float().mean().item()
    if changes:
        print(f"seed {seed} variance change per {args.variance_change_every} "
              "steps: " + " ".join(f"{s}:{c:.3f}" for s, c in changes),
              flush=True)
    return {"seed": seed, "test_accuracy": acc, "steps": step,
            "variance_change": changes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--optimizer", choices=["adam", "onebit_adam"],
                    default="onebit_adam")
    ap.add_argument("--freeze_step", type=int, default=600)
    ap.add_argument("--variance_floor", type=float, default=0.1)
    ap.add_argument("--compression_beta1", type=float, default=0.9,
                    help="the momentum's decay after the freeze (the "
                    "workers' and the shard's); 0.9 before it")
    ap.add_argument("--push", choices=["fp32", "onebit", "onebit_rotated", "quantize"],
                    default="onebit")
    ap.add_argument("--bits", type=int, default=4, help="quantize pushes")
    ap.add_argument("--push_feedback", choices=["ef", "ef21"], default="ef")
    ap.add_argument("--ef_decay", type=float, default=1.0,
                    help="the pushes' residual is kept times this "
                    "(pserver_worker --ef_decay)")
    ap.add_argument("--pull", choices=["fp32", "onebit", "onebit_rotated", "quantize"],
                    default="onebit")
    ap.add_argument("--pull_bits", type=int, default=4, help="quantize pulls")
    ap.add_argument("--block_size", type=int, default=256, help="onebit pushes")
    ap.add_argument("--pull_block_size", type=int, default=256,
                    help="onebit pulls")
    ap.add_argument("--local_steps", type=int, default=1,
                    help="after the freeze: local steps between pushes")
    ap.add_argument("--variance_change_every", type=int, default=0,
                    help="before the freeze: report the relative change of "
                    "sqrt(v) every this many steps (0: off)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--data_dir", default=DATA)
    ap.add_argument("--json", help="write every seed's result here")
    args = ap.parse_args()
    for name, val, lo, hi in (("bits", args.bits, 1, 8),
                              ("pull_bits", args.pull_bits, 1, 8)):
        if not lo <= val <= hi:
            sys.exit(f"onebit_reference.py: --{name} is {val}; expected {lo}..{hi}")
    if not 0.0 <= args.ef_decay <= 1.0:
        sys.exit(f"onebit_reference.py: --ef_decay is {args.ef_decay}; "
                 "expected 0..1")
    if args.ef_decay != 1.0 and args.push_feedback == "ef21":
        sys.exit(f"onebit_reference.py: --ef_decay is {args.ef_decay} with "
                 "--push_feedback ef21; expected 1 (EF21 keeps no residual)")
    if not 0.0 <= args.compression_beta1 < 1.0:
        sys.exit("onebit_reference.py: --compression_beta1 is "
                 f"{args.compression_beta1}; expected [0, 1)")
    if args.variance_change_every < 0:
        sys.exit("onebit_reference.py: --variance_change_every is "
                 f"{args.variance_change_every}; expected >= 0")
    if args.local_steps < 1:
        sys.exit(f"onebit_reference.py: --local_steps is {args.local_steps}; "
                 "expected >= 1")
    if args.local_steps > 1 and args.push_feedback == "ef21":
        sys.exit("onebit_reference.py: --push_feedback ef21 is for "
                 "--local_steps 1; got --local_steps "
                 f"{args.local_steps}")
    if args.workers < 1 or BATCH % args.workers:
        sys.exit(f"onebit_reference.py: --workers is {args.workers}; "
                 f"expected a divisor of {BATCH}")
    for name, val in (("block_size", args.block_size),
                      ("pull_block_size", args.pull_block_size)):
        if val < 1:
            sys.exit(f"onebit_reference.py: --{name} is {val}; expected >= 1")
    for name, val, c in (("block_size", args.block_size, args.push),
                         ("pull_block_size", args.pull_block_size, args.pull)):
        if c == "onebit_rotated" and val & (val - 1):
            sys.exit(f"onebit_reference.py: --{name} is {val}; expected a "
                     "power of two with onebit_rotated")
    torch.set_num_threads(1)
    train = ref.load(args.data_dir, "train")
    test = ref.load(args.data_dir, "t10k")
    results = []
    t0 = time.time()
    for seed in args.seeds:
        r = run(args, seed, train, test)
        results.append(r)
        print(f"seed {seed} test accuracy {100 * r['test_accuracy']:.2f}",
              flush=True)
    accs = [100 * r["test_accuracy"] for r in results]
    spread = f" std {statistics.stdev(accs):.2f}" if len(accs) > 1 else ""
    what = ("adam" if args.optimizer == "adam" else
            f"onebit_adam push {args.push} ({args.push_feedback}) "
            f"pull {args.pull}" +
            (f" local_steps {args.local_steps}" if args.local_steps > 1 else ""))
    print(f"{what}: mean "
          f"{statistics.mean(accs):.2f}{spread} over {len(accs)} seeds "
          f"({' / '.join(f'{a:.2f}' for a in accs)}), "
          f"{time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "runs": results}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
