"""One worker process of test_torch.py's training test.

    RANK=r WORLD_SIZE=n PSERVER_SERVERS=a,b python3 torch_worker.py OUT STEPS

Trains a 2-layer MLP on a synthetic, linearly separable dataset (the same on
every worker; each trains on its own half) through
pserver.torch.DistributedOptimizer, and saves to OUT: the parameters right
after construction, the loss on the whole dataset before and after, the
accuracy after, the final parameters and the client's stats.
"""

import os
import sys

import torch

import pserver
import pserver.torch


def dataset():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, 10, generator=g)
    direction = torch.randn(10, generator=g)
    y = (x @ direction > 0).long()
    return x, y


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # Different seeds on purpose: registration makes rank 0's init everyone's.
    torch.manual_seed(100 + rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 2))
    created = {k: v.clone() for k, v in model.state_dict().items()}
    opt = pserver.torch.DistributedOptimizer(model.named_parameters(),
                                             **pserver.init(),
                                             push_codec="onebit")
    after_register = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = dataset()
    loss_fn = torch.nn.CrossEntropyLoss()
    with torch.no_grad():
        loss_before = loss_fn(model(x), y).item()
    mine_x, mine_y = x[rank::world], y[rank::world]
    batch = 32
    for step in range(steps):
        i = (step * batch) % len(mine_x)
        loss = loss_fn(model(mine_x[i:i + batch]), mine_y[i:i + batch])
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        logits = model(x)
        loss_after = loss_fn(logits, y).item()
        accuracy = (logits.argmax(1) == y).float().mean().item()
    torch.save({"created": created, "after_register": after_register,
                "final": model.state_dict(), "loss_before": loss_before,
                "loss_after": loss_after, "accuracy": accuracy,
                "global_step": opt.global_step, "stats": opt.stats()}, out)


if __name__ == "__main__":
    main()
