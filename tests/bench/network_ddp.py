"""The PyTorch peer of tests/bench/network.sh: DDP over gloo, one rank.

A synthetic model of the same size as pserver_worker's --model=synthetic
(PARAMS parameters in TENSORS tensors, here 2-D so that PowerSGD compresses
them), trained with torch.optim.Adam; the gradient of every step is a fixed
per-rank noise buffer rotated by a step-dependent shift, as the pserver
worker's synthetic gradient is, and it reaches the parameters through a real
backward pass (loss = sum of <p_i, g_i>), so DDP's bucketed allreduce and its
communication hook run as in training. One process per rank:

  GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 tests/bench/network_ddp.py \
      --rank 0 --world_size 4 --master 198.18.1.20:29500 \
      --params 25000000 --tensors 8 --steps 30 --hook fp32 --json r0.json

--hook: fp32 (DDP's own allreduce), fp16 (fp16_compress_hook) or powersgd
(powerSGD_hook, --powersgd_rank, compressing from step --powersgd_start).
The JSON holds the rank's per-step seconds (forward, backward with its
allreduce, optimizer step) and the bytes one allreduce of the step's
gradient carries (allreduce_bytes), from which network.sh computes the ring
volume 2(N-1)/N x allreduce_bytes per worker.
"""

import argparse
import datetime
import json
import math
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "python" / "examples"


def tensor_shapes(params, tensors):
    """Sizes as pserver's synthetic model splits them, each as a near-square
    matrix: rows is the largest divisor of the size not above its root."""
    shapes, left = [], params
    for t in range(tensors):
        size = left // (tensors - t)
        left -= size
        rows = max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)
        shapes.append((rows, size // rows))
    return shapes


def allreduce_bytes(shapes, hook, rank, min_compression_rate):
    """Bytes one allreduce of a step's gradient carries once the hook is in
    its steady state. PowerSGD (torch 1.13) compresses a matrix when
    (n + m) * rank * min_compression_rate < n * m and then allreduces the
    fp32 factors P (n x rank) and Q (m x rank); any other tensor goes
    uncompressed in fp32."""
    total = 0
    for n, m in shapes:
        if hook == "fp32":
            total += 4 * n * m
        elif hook == "fp16":
            total += 2 * n * m
        elif (n + m) * rank * min_compression_rate < n * m:
            total += 4 * (n + m) * rank
        else:
            total += 4 * n * m
    return total


class Synthetic(nn.Module):
    def __init__(self, shapes, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weights = nn.ParameterList(
            nn.Parameter((torch.rand(s, generator=g) - 0.5) * 0.1)
            for s in shapes)

    def forward(self, grads):
        # d/dp <p, g> = g: the backward pass hands DDP exactly the gradient.
        return sum(torch.dot(p.view(-1), g) for p, g in zip(self.weights, grads))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world_size", type=int, required=True)
    ap.add_argument("--master", required=True, help="host:port of rank 0")
    ap.add_argument("--params", type=int, default=25_000_000)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hook", choices=["fp32", "fp16", "powersgd"], default="fp32")
    ap.add_argument("--powersgd_rank", type=int, default=4)
    ap.add_argument("--powersgd_start", type=int, default=2,
                    help="PowerSGD's start_powerSGD_iter: plain allreduce before")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds for rendezvous and each collective")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.tensors < 1 or a.params < a.tensors or a.steps < 1:
        sys.exit(f"network_ddp.py: --params {a.params} --tensors {a.tensors} "
                 f"--steps {a.steps}; expected 1 <= tensors <= params, steps >= 1")

    torch.set_num_threads(a.threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{a.master}", rank=a.rank,
        world_size=a.world_size, timeout=datetime.timedelta(seconds=a.timeout))
    shapes = tensor_shapes(a.params, a.tensors)
    bucket_mb = 25  # DDP's default
    if a.hook == "powersgd":
        # One bucket. torch 1.13's powerSGD_hook issues each bucket's later
        # allreduces (P, then Q) from future callbacks, so with several
        # buckets the ranks can issue them in different orders, and over
        # gloo the ranks then wait on each other for ever (seen here at the
        # first compressed step with 4 buckets of 25 MB).
        bucket_mb = a.params * 4 / 2**20 + 1
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_mb * 2**20)
    model = DistributedDataParallel(Synthetic(shapes, seed=1),  # rank 0's weights
                                    bucket_cap_mb=bucket_mb)
    min_rate = 2
    if a.hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif a.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=a.powersgd_rank,
            start_powerSGD_iter=a.powersgd_start, min_compression_rate=min_rate)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(1000 + a.rank)
    noise = (torch.rand(a.params, generator=g) - 0.5) * 0.01
    sizes = [n * m for n, m in shapes]
    dist.barrier()
    seconds, cpu = [], []
    for step in range(a.steps):
        t0, c0 = time.perf_counter(), time.process_time()  # every thread's CPU
        shift = (step * 2654435761 + 12345) % a.params
        grads = torch.roll(noise, shift).split(sizes)
        opt.zero_grad(set_to_none=True)
        model(grads).backward()  # returns once DDP's allreduces are done
        opt.step()
        seconds.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        print(f"rank {a.rank} step {step + 1}/{a.steps} {seconds[-1]:.3f} s", flush=True)
    sys.path.insert(0, str(EXAMPLES))
    import train_gpt
    del model  # the DDP wrapper first (train_gpt.end_ddp says why)
    train_gpt.end_ddp()

    with open(a.json, "w") as f:
        json.dump({
            "rank": a.rank, "world_size": a.world_size, "hook": a.hook,
            "params": a.params, "shapes": shapes, "threads": a.threads,
            "powersgd_rank": a.powersgd_rank if a.hook == "powersgd" else None,
            "bucket_cap_mb": bucket_mb,
            "compressed_from_step": a.powersgd_start if a.hook == "powersgd" else 0,
            "allreduce_bytes": allreduce_bytes(shapes, a.hook, a.powersgd_rank, min_rate),
            "step_seconds": seconds,
            "step_cpu_seconds": cpu,
        }, f)


if __name__ == "__main__":
    main()
