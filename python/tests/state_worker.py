"""A worker that is killed mid-run, for test_state.py; also its model and data.

    python3 state_worker.py SERVERS OUT STEPS

Trains worker 0 of 1 for STEPS steps through DistributedOptimizer with 1-bit
pushes, saves {"state": opt.state_dict(), "residual_norm": ...} to OUT with
torch.save, then kills itself with SIGKILL: no destructor, no goodbye to the
shards, as when a machine dies.
"""

import os
import signal
import sys

import torch

import pserver.torch


def model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def optimizer(net, servers):
    return pserver.torch.DistributedOptimizer(
        net.named_parameters(), servers=servers, worker_id=0, num_workers=1,
        push_codec="onebit", retry_budget=20)


def train_until(net, opt, last_step):
    """Steps until the shards' step is last_step; step t's batch depends on
    t alone, so a restarted worker sees the batches it would have seen."""
    loss_fn = torch.nn.CrossEntropyLoss()
    while opt.global_step < last_step:
        g = torch.Generator().manual_seed(1000 + opt.global_step)
        x = torch.randn(16, 8, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        loss_fn(net(x), y).backward()
        opt.step()
        opt.zero_grad()


def main():
    servers, out, steps = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    net = model()
    opt = optimizer(net, servers)
    train_until(net, opt, steps)
    torch.save({"state": opt.state_dict(),
                "residual_norm": opt.client.residual_norm}, out)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
