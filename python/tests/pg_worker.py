"""A rank that keeps a DDP script's own process group:
torch.distributed.init_process_group("gloo") from the environment the
launcher sets (env://, nothing passed), an all_reduce of rank + 1, and
destroy_process_group(), as nanoGPT's train.py does around its loop.

    pg_worker.py OUT_DIR    (writes OUT_DIR/rank<r>.txt: rank world sum)
"""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank{rank}.txt"), "w") as f:
    f.write(f"{rank} {world} {int(t.item())}\n")
