#!/usr/bin/env python3
"""A small CNN on Fashion-MNIST trained through pserver from PyTorch.

Two convolutions (5x5, 16 and 32 channels, each followed by ReLU and 2x2 max
pooling) and two linear layers (1568-128-10): about 215K parameters. The
loop is an ordinary PyTorch one; pserver.init() and the DistributedOptimizer
are the only pserver lines. Run it with the launcher, which starts the
shards and one process per worker (the optimizer and its learning rate are
the shards' flags):

    PYTHONPATH=build/python /usr/bin/python3 -m pserver.launch \\
        --shards 2 --workers 4 --optimizer onebit_adam --pull-codec onebit \\
        python/examples/fashion_cnn.py --epochs 1

Data and batches as train_mlp.py (same folder): Debian's
dataset-fashion-mnist IDX files in /usr/share/datasets/fashion-mnist (or
--data-dir), pixels in [0, 1]; each epoch a seeded permutation, global batch
g covers positions [g*W*b, (g+1)*W*b) and worker w takes its b of them.
Rank 0 evaluates on the test set after every epoch; every rank prints its
bytes at the end.
"""

import argparse
import json
import os
import sys
import time

import torch

import pserver
import pserver.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_mlp import load  # noqa: E402  (the IDX reader)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def batch_indices(n, seed, step, per_epoch, world, rank, batch, cache={}):
    """Example indices of worker `rank`'s batch at global step `step`: each
    epoch a permutation of the n examples seeded by (seed, epoch); global
    batch g of the epoch covers positions [g*world*batch, (g+1)*world*batch)
    and worker w takes its `batch` of them. One process with world=1 and
    batch=W*b gets exactly the union of W workers' batches."""
    epoch, g = divmod(step, per_epoch)
    if cache.get("key") != (n, seed, epoch):
        gen = torch.Generator().manual_seed(seed * 1000003 + epoch)
        cache["key"], cache["perm"] = (n, seed, epoch), torch.randperm(
            n, generator=gen)
    begin = (g * world + rank) * batch
    return cache["perm"][begin:begin + batch]


@torch.no_grad()
def evaluate(net, x, y, chunk=1000):
    correct, loss = 0, 0.0
    for i in range(0, len(x), chunk):
        logits = net(x[i:i + chunk])
        loss += torch.nn.functional.cross_entropy(
            logits, y[i:i + chunk], reduction="sum").item()
        correct += (logits.argmax(1) == y[i:i + chunk]).sum().item()
    return correct / len(x), loss / len(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0,
                   help="stop at this shard step instead of whole epochs")
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--push-codec", default="onebit")
    p.add_argument("--warmup-codec", default="bf16")
    p.add_argument("--k-fraction", type=float, default=0.01,
                   help="fraction of elements a topk push keeps")
    p.add_argument("--train-subset", type=int, default=0)
    p.add_argument("--test-subset", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--result-json", default="",
                   help="rank 0 writes its test accuracy, loss and bytes here")
    args = p.parse_args()
    torch.set_num_threads(1)  # the workers share the machine's cores

    where = pserver.init()
    rank, world = where["worker_id"], where["num_workers"]
    x_train, y_train = load(args.data_dir, "train", args.train_subset)
    x_test, y_test = load(args.data_dir, "t10k", args.test_subset)
    per_epoch = len(x_train) // (world * args.batch)
    if per_epoch == 0:
        sys.exit(f"fashion_cnn.py: {len(x_train)} examples hold no global "
                 f"batch of {world} x {args.batch}")
    last = args.steps if args.steps > 0 else args.epochs * per_epoch

    torch.manual_seed(args.seed)  # rank 0's initial weights become everyone's
    net = Net()
    opt = pserver.torch.DistributedOptimizer(
        net.named_parameters(), **where, push_codec=args.push_codec,
        warmup_codec=args.warmup_codec, k_fraction=args.k_fraction)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{sum(p.numel() for p in net.parameters())} parameters, "
        f"{world} workers, {per_epoch} steps per epoch, training to step "
        f"{last}", flush=True)

    start = time.monotonic()
    while opt.global_step < last:
        idx = batch_indices(len(x_train), args.seed, opt.global_step,
                            per_epoch, world, rank, args.batch)
        loss = torch.nn.functional.cross_entropy(net(x_train[idx]),
                                                 y_train[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        done = opt.global_step
        if done % args.log_every == 0:
            say(f"step {done}/{last} loss {loss.item():.4f}", flush=True)
        if rank == 0 and done % per_epoch == 0 and done != last:
            acc, test_loss = evaluate(net, x_test, y_test)
            say(f"epoch {done // per_epoch} step {done}: test accuracy "
                f"{acc:.4f}, test loss {test_loss:.4f}", flush=True)
    seconds = time.monotonic() - start

    s = opt.stats()
    print(f"worker {rank} done: {last} steps in {seconds:.1f} s, pushed "
          f"{s['push_payload_bytes']} bytes "
          f"({s['push_fp32_bytes'] / max(1, s['push_payload_bytes']):.1f}x "
          f"less than fp32), pulled {s['pull_payload_bytes']} bytes "
          f"({s['pull_fp32_bytes'] / max(1, s['pull_payload_bytes']):.1f}x "
          "less)", flush=True)
    if rank == 0:
        acc, test_loss = evaluate(net, x_test, y_test)
        print(f"test accuracy {acc:.4f}, test loss {test_loss:.4f} after "
              f"{last} steps", flush=True)
        if args.result_json:
            with open(args.result_json, "w") as f:
                json.dump({"workload": "cnn", "seed": args.seed,
                           "steps": last, "workers": world,
                           "parameters": sum(p.numel()
                                             for p in net.parameters()),
                           "test_accuracy": acc, "test_loss": test_loss,
                           "seconds": seconds, **{k: s[k] for k in (
                               "push_payload_bytes", "pull_payload_bytes",
                               "push_fp32_bytes", "pull_fp32_bytes",
                               "variance_payload_bytes")}},
                          f, indent=1)


if __name__ == "__main__":
    main()
