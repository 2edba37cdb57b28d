"""A worker script for test_node_push.py, run by pserver.launch.

    node_worker.py OUT_DIR STEPS MODE

Trains a small model with BatchNorm (so buffers travel too) on this
rank's own data (seeded by RANK) through DistributedOptimizer with what
the launcher set, then writes OUT_DIR/rank<RANK>.pt: the flat weights and
buffers, the step, stats() and what the run saw. MODE:
  sgd:      plain steps;
  branch:   the same with a parameter (bias2) that only the odd ranks
            use, on even steps: its .grad is None elsewhere;
  broadcast_clip: the same with buffers="broadcast", max_grad_norm=0.05
            and clip_scope="mean";
  local:    local steps (4 per push) with an inner SGD;
  overflow: GradScaler on the CPU (cpu_grad_scaler), rank 1's gradient
            made infinite at step 3;
  resume:   rank 0 saves state_dict() at STEPS // 2 into OUT_DIR/ckpt.pt,
            every rank loads it back at once and trains on.
  nan:      rank 1's gradient made NaN at step 2 (no scaler): the
            machine's mean is refused; each rank records the pserver.Error
            it got and stops;
  overlap:  overlap=True (refused with one push per machine);
  follower_saves: rank 1 calls state_dict() (refused on a follower).
"""

import os
import sys

import torch

import pserver
import pserver.torch


def main():
    out, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rank = int(os.environ["RANK"])
    torch.manual_seed(7)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12),
                                torch.nn.BatchNorm1d(12), torch.nn.ReLU(),
                                torch.nn.Linear(12, 3))
    if mode == "branch":  # a bias with a gradient on odd ranks, even steps
        model.register_parameter("bias2", torch.nn.Parameter(torch.zeros(3)))
    extra = {}
    if mode == "local":
        extra = dict(local_steps=4, inner_optimizer=torch.optim.SGD(
            model.parameters(), lr=0.05))
    if mode == "overlap":
        extra = dict(overlap=True)
    if mode == "broadcast_clip":
        # Rank 0's BatchNorm statistics for everyone; the shards clip the
        # round's mean gradient.
        extra = dict(buffers="broadcast", max_grad_norm=0.05,
                     clip_scope="mean")
    opt = pserver.torch.DistributedOptimizer(
        model.named_parameters(), **pserver.init(), module=model,
        lr=0.7 if mode == "local" else 0.05,  # local: the outer lr
        **extra)
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    scaler = None
    if mode == "overflow":
        import cpu_grad_scaler
        cpu_grad_scaler.enable(setattr)
        scaler = cpu_grad_scaler.CpuGradScaler(init_scale=2.0 ** 8)
    gen = torch.Generator().manual_seed(100 + rank)
    skipped, error = [], None
    for step in range(steps):
        x = torch.randn(16, 6, generator=gen)
        y = torch.randint(0, 3, (16,), generator=gen)
        logits = model(x)
        if mode == "branch" and rank % 2 == 1 and step % 2 == 0:
            logits = logits + model.bias2
        loss = torch.nn.functional.cross_entropy(logits, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            if rank == 1 and step == 3:
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            skipped.append(opt.client.round_skipped)
        else:
            loss.backward()
            if mode == "nan" and rank == 1 and step == 2:
                model[0].weight.grad[0, 0] = float("nan")
            try:
                opt.step()
            except pserver.Error as e:  # mode "nan": refused, and said
                error = {"type": type(e).__name__, "code": e.code,
                         "message": str(e)}
                break
        opt.zero_grad()
        if mode == "follower_saves" and rank == 1:
            opt.state_dict()
        if mode == "resume" and step == steps // 2 - 1:
            ckpt = os.path.join(out, "ckpt.pt")
            if rank == 0:
                torch.save({"model": model.state_dict(),
                            "optimizer": opt.state_dict()}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            while not os.path.exists(ckpt):
                pass
            saved = torch.load(ckpt)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optimizer"])
    flat = torch.cat([t.detach().float().reshape(-1)
                      for t in list(model.parameters()) + list(
                          model.buffers())])
    torch.save({"flat": flat, "start": start, "step": opt.global_step,
                "stats": opt.stats(),
                "skipped": skipped, "init": pserver.init(), "error": error,
                "scale": None if scaler is None else scaler.get_scale()},
               os.path.join(out, f"rank{rank}.pt"))
    print(f"rank {rank} done at step {opt.global_step}", flush=True)


if __name__ == "__main__":
    main()
