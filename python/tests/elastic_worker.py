"""A worker of test_elastic.py: a small linear model trained with
DistributedOptimizer (SGD on the shards) until the shards' step reaches
TOTAL, a short sleep per step so the test can place joins and leaves. Each
step it appends "global_step time" to OUT/times<rank> (test_elastic.py
reads the steps, tests/bench/elastic_membership.py the times); at the end (a normal
finish, or SystemExit(0) after leaving on SIGTERM) OUT/rank<rank>.json
holds the steps it made, the step it started and ended at, and a checksum
of its weights."""

import hashlib
import json
import os
import sys
import time

import torch

import pserver
import pserver.torch


def main(out, total, pause):
    where = pserver.init()
    rank = where["worker_id"]
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = pserver.torch.DistributedOptimizer(model.parameters(), **where,
                                             lr=0.05, module=model)
    gen = torch.Generator().manual_seed(rank + 1)
    first, steps = opt.global_step, 0
    record = {"rank": rank, "first_step": first}

    def save():
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        record.update(steps=steps, last_step=opt.global_step,
                      checksum=hashlib.sha256(w.numpy().tobytes()).hexdigest())
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(record, f)

    try:
        while opt.global_step < total:
            x = torch.randn(8, 16, generator=gen)
            loss = ((model(x) - x[:, :4]) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            with open(os.path.join(out, f"times{rank}"), "a") as f:
                f.write(f"{opt.global_step} {time.time():.4f}\n")
            time.sleep(pause)
    except SystemExit:
        record["left"] = True
        raise
    finally:
        save()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
