"""One worker process of test_torch_schedulers.py's golden test; also its
model, groups, schedule and batches, which the test imports for the
reference.

    RANK=r WORLD_SIZE=n PSERVER_SERVERS=a,b python3 optim_worker.py OUT STEPS

Trains model() through DistributedOptimizer with AdamW's two weight-decay
groups (0.1 on the matrices, 0.0 on the biases) and a LambdaLR warmup +
cosine schedule, fp32 pushes, on batch(step, rank); saves the final
parameters and the learning rates each step used to OUT.
"""

import math
import os
import sys

import torch

import pserver
import pserver.torch

PEAK_LR, WARMUP = 0.01, 4


def model():
    torch.manual_seed(21)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def groups(net):
    """nanoGPT's split: weight decay on the matrices, none on the biases."""
    decay = [p for p in net.parameters() if p.dim() >= 2]
    no_decay = [p for p in net.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1},
            {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(steps):
    """LambdaLR's factor: linear warmup over WARMUP steps, then a cosine
    down to 0.1 at `steps`."""
    def factor(s):
        if s < WARMUP:
            return (s + 1) / WARMUP
        progress = min(1.0, (s - WARMUP) / max(1, steps - WARMUP))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    return x, y


def loss_of(net, step, rank):
    x, y = batch(step, rank)
    return torch.nn.functional.cross_entropy(net(x), y)


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    net = model()
    opt = pserver.torch.DistributedOptimizer(
        groups(net), **pserver.init(), lr=PEAK_LR, module=net,
        push_codec="fp32")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(steps))
    lrs = []
    for step in range(steps):
        loss_of(net, step, rank).backward()
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        opt.zero_grad()
        sched.step()
    torch.save({"final": net.state_dict(), "lrs": lrs,
                "global_step": opt.global_step,
                "layout": opt.state_dict()["layout"]}, out)


if __name__ == "__main__":
    main()
