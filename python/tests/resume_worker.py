"""A worker script for test_launch_prep.py, run by pserver.launch.

    resume_worker.py OUT_DIR TOTAL [STOP_AT]

Trains a tiny linear model through DistributedOptimizer (fp32 pushes) until
the shards' step is TOTAL, from wherever the shards are: a job they restored
from its checkpoints goes on from there, as a script that counts its steps
by opt.global_step does. Each rank writes OUT_DIR/rank<RANK>.start.pt
({"step", "weights"}: what it got at construction) and .end.pt; rank 0 also
writes OUT_DIR/step<k>.pt, its weights after step k. A run that reaches
STOP_AT by training writes OUT_DIR/rank<RANK>.stopped and sleeps there (a
job to stop); the same command again starts at STOP_AT and goes on.
"""

import os
import sys
import time

import torch

import pserver
import pserver.torch


def save(out, name, step, model):
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"step": step, "weights": weights}, os.path.join(out, name))


def main():
    out, total = sys.argv[1], int(sys.argv[2])
    stop_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    where = pserver.init()
    rank = where["worker_id"]
    torch.manual_seed(7)
    torch.set_num_threads(1)
    # 1040 elements: every one of 3 shards holds some (256-element blocks).
    model = torch.nn.Linear(64, 16)
    opt = pserver.torch.DistributedOptimizer(model.named_parameters(),
                                             **where, push_codec="fp32")
    start = opt.global_step
    save(out, f"rank{rank}.start.pt", start, model)
    torch.manual_seed(100 + rank)  # each rank its own batch, every step
    x = torch.randn(32, 64)
    y = x[:, :16].argmax(dim=1)
    while opt.global_step < total:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            save(out, f"step{opt.global_step}.pt", opt.global_step, model)
        if stop_at is not None and start < stop_at == opt.global_step:
            open(os.path.join(out, f"rank{rank}.stopped"), "w").close()
            while True:
                time.sleep(1)
    save(out, f"rank{rank}.end.pt", opt.global_step, model)
    print(f"rank {rank} from step {start} to {opt.global_step}", flush=True)


if __name__ == "__main__":
    main()
