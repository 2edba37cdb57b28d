"""A worker script for test_launch.py's --recipe run, run by pserver.launch.

    recipe_worker.py OUT_DIR STEPS [H]

Trains a small MLP for STEPS steps through DistributedOptimizer without any
Client option (what the launcher's recipe gives through
PSERVER_CLIENT_OPTIONS applies), with H: local steps, H steps of Adam
between pushes and no outer_momentum argument, and writes
OUT_DIR/rank<RANK>.json: the client's stats, the shards' settings, the
schedule phase, the outer momentum's beta and the environment variable it
saw.
"""

import json
import os
import sys

import torch

import pserver
import pserver.torch


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    local = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    where = pserver.init()
    torch.manual_seed(7)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4))
    if local > 1:
        opt = pserver.torch.DistributedOptimizer(
            model.named_parameters(), **where, local_steps=local,
            inner_optimizer=torch.optim.Adam(model.parameters(), lr=1e-3))
    else:
        opt = pserver.torch.DistributedOptimizer(model.named_parameters(),
                                                 **where, lr=1e-3)
    gen = torch.Generator().manual_seed(where["worker_id"])
    for _ in range(steps):
        x = torch.randn(32, 32, generator=gen)
        y = (x[:, 0] > 0).long()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    with open(os.path.join(out, f"rank{where['worker_id']}.json"), "w") as f:
        json.dump({"stats": opt.stats(),
                   "shard_config": opt.client.shard_config,
                   "schedule_phase": opt.client.schedule_phase,
                   "global_step": opt.global_step,
                   "outer_beta": (None if opt._outer is None
                                  else opt._outer.beta),
                   "env": os.environ.get("PSERVER_CLIENT_OPTIONS")}, f)
    print(f"rank {where['worker_id']} done at step {opt.global_step}",
          flush=True)


if __name__ == "__main__":
    main()
