#!/usr/bin/python3
"""Single-process PyTorch reference for the fidelity benchmark (not a test).

Trains the reference MLP (784-256-128-10, ReLU, cross-entropy) with
torch.optim.Adam (lr 1e-3, PyTorch's defaults otherwise: bias correction,
eps 1e-8 outside the square root) on the Fashion-MNIST files the worker reads,
global batch 128, pixels / 255, a fresh permutation each epoch, and prints the
first steps' losses and the test accuracy after each epoch.

Two recipes:
  --recipe torch    PyTorch's own: torch.manual_seed(seed), nn.Linear's default
                    initialisation, torch.randperm each epoch. The independent
                    reference accuracy.
  --recipe pserver  pserver's seeded streams re-implemented here (worker/rng.h:
                    SplitMix64, DeriveSeed; worker/batcher.cc's Fisher-Yates;
                    worker/mlp.cc's InitParams with --init), so the same seed
                    gives the same initial weights and the same batches as
                    pserver_worker: the losses of the first steps can be
                    compared with the worker's log line by line.

The last incomplete batch of an epoch is dropped (468 steps of 128), as
worker/batcher.h does; --keep_last keeps it (DataLoader's default).

  /usr/bin/python3 tests/bench/torch_reference.py --seeds 1 2 3
  /usr/bin/python3 tests/bench/torch_reference.py --recipe pserver --steps 20
"""
import argparse
import gzip
import json
import math
import os
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def derive_seed(seed, stream):
    return mix64(seed ^ mix64((stream + 0x632BE59BD9B4E019) & MASK))


class SplitMix64:
    """worker/rng.h's generator, bit for bit."""

    def __init__(self, seed):
        self.state = seed & MASK
        self.spare = None

    def next(self):
        self.state = (self.state + GOLDEN) & MASK
        return mix64(self.state)

    def next_double(self):
        return (self.next() >> 11) * 2.0**-53

    def uniform(self, bound):
        m = self.next() * bound
        low = m & MASK
        if low < bound:
            threshold = ((1 << 64) - bound) % bound
            while low < threshold:
                m = self.next() * bound
                low = m & MASK
        return m >> 64

    def normal(self):
        if self.spare is not None:
            s, self.spare = self.spare, None
            return s
        u1 = 1.0 - self.next_double()
        u2 = self.next_double()
        r = math.sqrt(-2.0 * math.log(u1))
        theta = 6.283185307179586476925 * u2
        self.spare = r * math.sin(theta)
        return r * math.cos(theta)


def pserver_permutation(n, seed, epoch):
    """worker/batcher.cc's EpochPermutation."""
    perm = list(range(n))
    rng = SplitMix64(derive_seed(seed, epoch))
    for i in range(n, 1, -1):
        j = rng.uniform(i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return torch.tensor(perm, dtype=torch.long)


def pserver_init(model, seed, scheme):
    """worker/mlp.cc's InitParams: tensor t (fc1.weight, fc1.bias, ...) from
    stream DeriveSeed(seed, t)."""
    tensors = []
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            tensors += [layer.weight, layer.bias]
    with torch.no_grad():
        for t, p in enumerate(tensors):
            fan_in = tensors[t - (t % 2)].shape[1]
            rng = SplitMix64(derive_seed(seed, t))
            n = p.numel()
            if scheme == "pytorch":
                bound = 1.0 / math.sqrt(fan_in)
                vals = [bound * (2.0 * rng.next_double() - 1.0) for _ in range(n)]
            elif p.dim() == 1:
                vals = [0.0] * n
            else:
                std = math.sqrt(2.0 / fan_in)
                vals = [std * rng.normal() for _ in range(n)]
            p.copy_(torch.tensor(vals, dtype=torch.float64).view_as(p))


class DeepSpeedAdam(torch.optim.Optimizer):
    """Adam without bias correction, eps outside the square root: what the
    shards run with --bias_correction=false, onebit_adam's default
    (server/moment_optimizer.cc)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-group["lr"])


def read_idx(path):
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    t = torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8)
    return t.view(*dims)


def load(data_dir, prefix):
    def find(name):
        for suffix in (".gz", ""):
            p = os.path.join(data_dir, name + suffix)
            if os.path.exists(p):
                return p
        sys.exit(f"torch_reference.py: no {name}[.gz] in {data_dir}")

    x = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    y = read_idx(find(f"{prefix}-labels-idx1-ubyte"))
    return x.view(x.shape[0], -1).float() / 255.0, y.long()


def mlp():
    """The reference MLP, 784-256-128-10 with ReLU (nn.Linear's own init)."""
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def run(args, seed, train, test):
    torch.manual_seed(seed)
    model = mlp()
    if args.recipe == "pserver":
        pserver_init(model, seed, args.init)
    if args.adam == "torch":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        opt = DeepSpeedAdam(model.parameters(), lr=args.lr)
    x, y = train
    n = x.shape[0]
    per_epoch = n // args.batch + (1 if args.keep_last and n % args.batch else 0)
    total = args.steps if args.steps > 0 else args.epochs * per_epoch
    losses = []  # (step, loss over the global batch, loss over its first slice)
    accuracies = []
    step = 0
    t0 = time.time()
    for epoch in range(math.ceil(total / per_epoch)):
        perm = (pserver_permutation(n, seed, epoch) if args.recipe == "pserver"
                else torch.randperm(n))
        for b in range(per_epoch):
            if step >= total:
                break
            idx = perm[b * args.batch:(b + 1) * args.batch]
            logits = model(x[idx])
            loss = F.cross_entropy(logits, y[idx])
            if step < args.print_steps:
                with torch.no_grad():
                    first = F.cross_entropy(logits[:args.slice], y[idx][:args.slice])
                losses.append((step, loss.item(), first.item()))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        if step % per_epoch == 0 or step >= total:
            with torch.no_grad():
                acc = (model(test[0]).argmax(1) == test[1]).float().mean().item()
            accuracies.append(acc)
            print(f"seed {seed} epoch {epoch} step {step} test accuracy {acc:.4f}",
                  flush=True)
    return {"seed": seed, "recipe": args.recipe,
            "init": args.init if args.recipe == "pserver" else "pytorch",
            "adam": args.adam, "keep_last": args.keep_last,
            "steps": step, "test_accuracy": accuracies[-1],
            "test_accuracy_per_epoch": accuracies,
            "first_losses": [{"step": s, "loss": l, "first_slice_loss": f}
                             for s, l, f in losses],
            "wall_seconds": round(time.time() - t0, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--recipe", choices=["torch", "pserver"], default="torch")
    ap.add_argument("--init", choices=["pytorch", "he_normal"], default="pytorch",
                    help="--recipe pserver: pserver_worker's --init")
    ap.add_argument("--adam", choices=["torch", "deepspeed"], default="torch",
                    help="torch.optim.Adam, or Adam without bias correction "
                         "(the shards with --bias_correction=false)")
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0, help="> 0: stop after N")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--keep_last", action="store_true")
    ap.add_argument("--print_steps", type=int, default=20)
    ap.add_argument("--slice", type=int, default=32,
                    help="also print the loss over the first SLICE examples "
                         "of each batch (worker 0's share with 4 workers)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write every seed's result here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train, test = load(args.data_dir, "train"), load(args.data_dir, "t10k")
    results = []
    for seed in args.seeds:
        r = run(args, seed, train, test)
        results.append(r)
        print(f"seed {seed} first {len(r['first_losses'])} steps: loss over the "
              f"batch of {args.batch} / over its first {args.slice}")
        for e in r["first_losses"]:
            print(f"  step {e['step']:3d} {e['loss']:.4f} {e['first_slice_loss']:.4f}")
    accs = [r["test_accuracy"] * 100 for r in results]
    spread = f" std {statistics.stdev(accs):.2f}" if len(accs) > 1 else ""
    print(f"recipe {args.recipe}, adam {args.adam}: test accuracy % per seed "
          f"{' / '.join(f'{a:.2f}' for a in accs)}; mean {statistics.mean(accs):.2f}"
          f"{spread}, min {min(accs):.2f}, max {max(accs):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
