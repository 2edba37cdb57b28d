"""A worker script for test_launch.py, run by pserver.launch.

    launch_worker.py OUT_DIR STEPS [FAIL_RANK [MODE]]

Trains a tiny linear model for STEPS steps through DistributedOptimizer with
the environment the launcher set (pserver.init()), and writes
OUT_DIR/rank<RANK>.txt with what it saw. The rank FAIL_RANK instead exits 3
after registering (MODE "exit", the default), or sleeps forever (MODE
"hang": a process the launcher has to stop).
"""

import os
import sys
import time

import torch

import pserver
import pserver.torch


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    fail_rank = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    mode = sys.argv[4] if len(sys.argv) > 4 else "exit"
    where = pserver.init()
    rank = where["worker_id"]
    torch.manual_seed(7)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 2)
    opt = pserver.torch.DistributedOptimizer(model.named_parameters(),
                                             **where, push_codec="fp32")
    if rank == fail_rank:
        if mode == "hang":
            while True:
                time.sleep(1)
        print(f"rank {rank} failing on purpose", flush=True)
        sys.exit(3)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    for _ in range(steps):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
        f.write(f"{os.environ['RANK']} {os.environ['WORLD_SIZE']} "
                f"{os.environ['LOCAL_RANK']} {len(where['servers'])} "
                f"{opt.global_step}\n")
    print(f"rank {rank} done at step {opt.global_step}", flush=True)


if __name__ == "__main__":
    main()
