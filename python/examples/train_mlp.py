#!/usr/bin/env python3
"""Fashion-MNIST MLP trained through pserver from PyTorch.

The reference workload of pserver_worker (784-256-128-10, ReLU, cross
entropy) written as an ordinary PyTorch loop; three lines make it
distributed: pserver.init(), the DistributedOptimizer, and nothing else
(loss.backward(); opt.step(); opt.zero_grad() are unchanged). The optimizer
(1-bit Adam, Adam, SGD) and its learning rate are the shards' flags.

    RANK=0 WORLD_SIZE=2 PSERVER_SERVERS=127.0.0.1:50051 \\
        PYTHONPATH=build/python /usr/bin/python3 python/examples/train_mlp.py

Data: the IDX files pserver_worker reads (Debian's dataset-fashion-mnist,
/usr/share/datasets/fashion-mnist, {train,t10k}-{images-idx3,labels-idx1}-
ubyte, gzip or plain), pixels scaled to [0, 1]. Batches as pserver_worker's
batcher (worker/batcher.h): each epoch a seeded permutation of the training
set; global batch g covers positions [g*W*b, (g+1)*W*b) and worker w takes
its b of them, so W workers together see the batches one process with
batch W*b would (the permutation itself is torch's, not the C++ one).

With --state FILE the worker saves opt.state_dict() every --state-every steps
and at the end, and loads it at start when present: a worker killed and
started again with the same command continues where the shards are, with
its error-feedback residuals (the batch follows the shards' step).
"""

import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch

import pserver
import pserver.torch


def read_idx(data_dir, stem):
    """The IDX file data_dir/stem[.gz] as a uint8 array of its shape."""
    path = os.path.join(data_dir, stem)
    if os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rb") as f:
            data = f.read()
    elif os.path.exists(path):
        with open(path, "rb") as f:
            data = f.read()
    else:
        sys.exit(f"train_mlp.py: no {path}[.gz]; install Debian's "
                 "dataset-fashion-mnist or pass --data-dir")
    if len(data) < 4:
        sys.exit(f"train_mlp.py: {path} is not an IDX file")
    zero, kind, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or kind != 0x08 or ndim not in (1, 3):
        sys.exit(f"train_mlp.py: {path}: IDX magic {data[:4].hex()}; "
                 "expected unsigned bytes, 1 or 3 dimensions")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    values = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if values.size != int(np.prod(dims)):
        sys.exit(f"train_mlp.py: {path} holds {values.size} values; its "
                 f"header says {dims}")
    return values.reshape(dims)


def load(data_dir, split, subset):
    images = read_idx(data_dir, f"{split}-images-idx3-ubyte")
    labels = read_idx(data_dir, f"{split}-labels-idx1-ubyte")
    if subset > 0:
        images, labels = images[:subset], labels[:subset]
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32))
    return x / 255.0, torch.from_numpy(labels.astype(np.int64))


def model(hidden, seed):
    torch.manual_seed(seed)
    sizes = [784] + hidden
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(sizes[-1], 10))
    return torch.nn.Sequential(*layers)


@torch.no_grad()
def evaluate(net, x, y):
    logits = net(x)
    loss = torch.nn.functional.cross_entropy(logits, y).item()
    return (logits.argmax(1) == y).float().mean().item(), loss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0,
                   help="stop at this shard step instead of whole epochs")
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--hidden", default="256,128")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--push-codec", default="onebit")
    p.add_argument("--warmup-codec", default="bf16")
    p.add_argument("--train-subset", type=int, default=0)
    p.add_argument("--test-subset", type=int, default=0)
    p.add_argument("--state", default="", help="state_dict file (restarts)")
    p.add_argument("--state-every", type=int, default=100)
    p.add_argument("--metrics-listen", default="",
                   help="host:port for this worker's /metrics")
    p.add_argument("--log-every", type=int, default=100)
    args = p.parse_args()
    torch.set_num_threads(1)  # the workers share the machine's cores

    where = pserver.init()
    rank, world = where["worker_id"], where["num_workers"]
    x_train, y_train = load(args.data_dir, "train", args.train_subset)
    x_test, y_test = load(args.data_dir, "t10k", args.test_subset)
    per_epoch = len(x_train) // (world * args.batch)
    if per_epoch == 0:
        sys.exit(f"train_mlp.py: {len(x_train)} examples hold no global "
                 f"batch of {world} x {args.batch}")
    last = args.steps if args.steps > 0 else args.epochs * per_epoch

    net = model([int(h) for h in args.hidden.split(",")], args.seed)
    opt = pserver.torch.DistributedOptimizer(
        net.named_parameters(), **where, push_codec=args.push_codec,
        warmup_codec=args.warmup_codec, metrics_listen=args.metrics_listen)
    if args.state and os.path.exists(args.state):
        opt.load_state_dict(torch.load(args.state))
        print(f"worker {rank}: restored {args.state} at step "
              f"{opt.global_step}", flush=True)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{sum(p.numel() for p in net.parameters())} parameters, "
        f"{world} workers, {per_epoch} steps per epoch, training to step "
        f"{last}", flush=True)

    perm_epoch, perm = -1, None
    start = time.monotonic()
    while opt.global_step < last:
        step = opt.global_step
        epoch, g = divmod(step, per_epoch)
        if epoch != perm_epoch:
            gen = torch.Generator().manual_seed(args.seed * 1000003 + epoch)
            perm, perm_epoch = torch.randperm(len(x_train), generator=gen), epoch
        begin = (g * world + rank) * args.batch
        idx = perm[begin:begin + args.batch]
        loss = torch.nn.functional.cross_entropy(net(x_train[idx]),
                                                 y_train[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        done = opt.global_step
        if args.state and (done % args.state_every == 0 or done == last):
            torch.save(opt.state_dict(), args.state + ".tmp")
            os.replace(args.state + ".tmp", args.state)
        if done % args.log_every == 0:
            say(f"step {done}/{last} loss {loss.item():.4f}", flush=True)
        if done % per_epoch == 0 or done == last:
            acc, test_loss = evaluate(net, x_test, y_test)
            say(f"epoch {(done - 1) // per_epoch + 1} step {done}: test "
                f"accuracy {acc:.4f}, test loss {test_loss:.4f}", flush=True)

    s = opt.stats()
    acc, _ = evaluate(net, x_test, y_test)
    print(f"worker {rank} done: {last} steps in "
          f"{time.monotonic() - start:.1f} s, test accuracy {acc:.4f}, "
          f"pushed {s['push_payload_bytes']} bytes "
          f"({s['push_fp32_bytes'] / max(1, s['push_payload_bytes']):.1f}x "
          f"less than fp32), pulled {s['pull_payload_bytes']} bytes "
          f"({s['pull_fp32_bytes'] / max(1, s['pull_payload_bytes']):.1f}x "
          "less)", flush=True)


if __name__ == "__main__":
    main()
