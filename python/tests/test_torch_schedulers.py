"""DistributedOptimizer with torch.optim.lr_scheduler (issue 27): each
stock scheduler step by step, the shards' own schedule, the golden run of
two worker processes with a warmup + cosine LambdaLR, and a resume with the
scheduler's state, against real pserver_server processes and real
torch.optim.AdamW. The model, groups and helpers are test_torch_optim's."""

import gc
import io
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from test_torch import finish
from test_torch_optim import FP32_ADAM, Net, groups, loss_of, make

import pserver
import optim_worker  # python/tests/, on sys.path under pytest

HERE = pathlib.Path(__file__).resolve().parent
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])
# The shards compute x -= lr * (m^ / (sqrt(v^) + eps) + wd * x) in float32;
# torch.optim.AdamW does x *= 1 - lr * wd, then the Adam step, with its
# own order of operations: equal to float32 rounding, not bit for bit.
RTOL, ATOL = 1e-5, 1e-6


def adamw_groups(net):
    return [{"params": [net.fc1.weight, net.fc2.weight], "weight_decay": 0.1},
            {"params": [net.fc1.bias, net.fc2.bias], "weight_decay": 0.0}]


SCHEDULERS = {
    # Group 1's lr is 0: its weights stay where they are.
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(
        o, [optim_worker.warmup_cosine(8), lambda s: 0.0]),
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, 2, gamma=0.3),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.
    CosineAnnealingLR(o, T_max=6, eta_min=1e-4),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=[0.03, 0.01], total_steps=8, cycle_momentum=False),
    "LinearLR+SequentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=3),
            torch.optim.lr_scheduler.ExponentialLR(o, 0.7)], milestones=[3]),
    "ReduceLROnPlateau": lambda o: torch.optim.lr_scheduler.
    ReduceLROnPlateau(o, factor=0.5, patience=0),
}


# SequentialLR steps its schedulers with an epoch, which torch warns about.
@pytest.mark.filterwarnings("ignore:The epoch parameter")
@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_sets_what_the_shards_apply(shards, name):
    """Each stock scheduler on both: the shards' weights equal
    torch.optim.AdamW's with the same scheduler, step by step, and the
    learning rate did change (so a shard ignoring it would fail)."""
    addrs = shards(1, 1, *FP32_ADAM)
    net, ref = Net(), Net()
    opt = make(groups(net), addrs, lr=0.01)
    ref_opt = torch.optim.AdamW(adamw_groups(ref), lr=0.01)
    scheds = [SCHEDULERS[name](o) for o in (opt, ref_opt)]
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    lrs = set()
    for step in range(7):
        for m in (net, ref):
            loss_of(m, step).backward()
        assert [g["lr"] for g in opt.param_groups] == [
            g["lr"] for g in ref_opt.param_groups]
        lrs.add(opt.param_groups[0]["lr"])
        opt.step()
        ref_opt.step()
        for o, s in zip((opt, ref_opt), scheds):
            o.zero_grad()
            if name == "ReduceLROnPlateau":
                s.step(float(step))  # a loss that only grows
            else:
                s.step()
        for a, b in zip(net.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    assert len(lrs) >= 3, lrs
    assert opt.global_step == 7
    if name == "LambdaLR":
        assert torch.equal(net.fc1.bias, start["fc1.bias"])
        assert torch.equal(net.fc2.bias, start["fc2.bias"])
        assert not torch.equal(net.fc1.weight, start["fc1.weight"])


def test_shards_schedule_applies_without_client_values(shards):
    """No lr given and nothing changed: the shards' --lr and each group's
    registered weight decay and lr_scale apply (equal to AdamW with the
    same values)."""
    addrs = shards(1, 1, *FP32_ADAM, "--lr=0.02", "--weight_decay=0.05")
    net, ref = Net(), Net()
    gs = groups(net)
    gs[1]["lr_scale"] = 0.5
    del gs[1]["weight_decay"]  # the shards' --weight_decay
    opt = make(gs, addrs)
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [
        (0.02, 0.1), (0.01, 0.05)]
    rg = adamw_groups(ref)
    rg[1].update(lr=0.01, weight_decay=0.05)
    ref_opt = torch.optim.AdamW(rg, lr=0.02)
    for step in range(4):
        for m, o in ((net, opt), (ref, ref_opt)):
            loss_of(m, step).backward()
            o.step()
            o.zero_grad()
    assert opt.state_dict()["pserver_hyper_from_client"] is False
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def test_two_worker_processes_equal_adamw_on_the_mean_gradient(shards,
                                                              tmp_path):
    """The golden test: 2 worker processes, 2 shards, fp32 both ways,
    --optimizer=adam with its default bias correction, weight decay groups
    0.1 / 0.0 and a LambdaLR warmup + cosine: the final weights equal
    torch.optim.AdamW's with the same scheduler on the mean of the two
    workers' gradients."""
    steps = 20
    addrs = shards(2, 2, *FP32_ADAM)
    env = dict(os.environ, WORLD_SIZE="2", PSERVER_SERVERS=",".join(addrs),
               PYTHONPATH=os.pathsep.join([PACKAGE_ROOT, str(HERE),
                                           os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen(
        [sys.executable, str(HERE / "optim_worker.py"),
         str(tmp_path / f"w{r}.pt"), str(steps)],
        env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT) for r in range(2)]
    finish(procs)
    w = [torch.load(tmp_path / f"w{r}.pt") for r in range(2)]
    for k in w[0]["final"]:
        assert torch.equal(w[0]["final"][k], w[1]["final"][k]), k
    assert w[0]["global_step"] == steps
    assert [n for n, _ in w[0]["layout"]][:2] == ["0.weight", "2.weight"]

    def reference(schedule):
        ref = optim_worker.model()
        opt = torch.optim.AdamW(optim_worker.groups(ref),
                                lr=optim_worker.PEAK_LR)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        lrs = []
        for step in range(steps):
            gs = []
            for rank in range(2):
                opt.zero_grad()
                optim_worker.loss_of(ref, step, rank).backward()
                gs.append([p.grad.clone() for p in ref.parameters()])
            for p, a, b in zip(ref.parameters(), *gs):
                p.grad = (a + b) / 2
            lrs.append([g["lr"] for g in opt.param_groups])
            opt.step()
            sched.step()
        return ref.state_dict(), lrs

    ref, lrs = reference(optim_worker.warmup_cosine(steps))
    assert w[0]["lrs"] == lrs
    worst = max((w[0]["final"][k] - v).abs().max().item()
                for k, v in ref.items())
    for k, v in ref.items():
        torch.testing.assert_close(w[0]["final"][k], v, rtol=RTOL,
                                   atol=ATOL)
    # A shard that ignored the schedule would be this far off:
    flat, _ = reference(lambda s: 1.0)
    off = max((w[0]["final"][k] - v).abs().max().item()
              for k, v in flat.items())
    assert off > 100 * ATOL, off
    print(f"largest difference from torch.optim.AdamW after {steps} steps: "
          f"{worst:.3g} (constant lr instead: {off:.3g})")


def test_state_dict_resumes_with_model_and_scheduler(shards):
    """torch.save({"model", "optimizer", "scheduler"}) after 3 steps, a new
    optimizer (a restarted worker) loads it and 3 more steps end bit for
    bit where an uninterrupted run does; param_groups come back."""
    def schedule(o):
        return torch.optim.lr_scheduler.LambdaLR(
            o, optim_worker.warmup_cosine(6))

    def train(net, opt, sched, steps):
        for step in steps:
            loss_of(net, step).backward()
            opt.step()
            opt.zero_grad()
            sched.step()

    net = Net()
    opt = make(groups(net), shards(1, 1, *FP32_ADAM), lr=0.01,
               module=net)
    train(net, opt, schedule(opt), range(6))
    uninterrupted = [p.detach().clone() for p in net.parameters()]
    del opt

    addrs = shards(1, 1, *FP32_ADAM)
    net = Net()
    opt = make(groups(net), addrs, lr=0.01, module=net)
    sched = schedule(opt)
    train(net, opt, sched, range(3))
    saved_groups = [dict(g, params=None) for g in opt.param_groups]
    f = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict()}, f)
    del opt, sched
    gc.collect()  # the restarted worker's predecessor is gone
    f.seek(0)
    ckpt = torch.load(f)
    assert ckpt["optimizer"]["state"] == {}
    assert ckpt["optimizer"]["param_groups"][1]["params"] == [3, 4]

    net = Net(seed=9)
    net.load_state_dict(ckpt["model"])
    opt = make(groups(net), addrs, lr=0.01, module=net)
    assert opt.global_step == 3
    sched = schedule(opt)
    opt.load_state_dict(ckpt["optimizer"])
    sched.load_state_dict(ckpt["scheduler"])
    assert [dict(g, params=None) for g in opt.param_groups] == saved_groups
    train(net, opt, sched, range(3, 6))
    for a, b in zip(net.parameters(), uninterrupted):
        assert torch.equal(a, b)
    # The earlier format (the client's record only) still loads.
    old = {k: v for k, v in opt.state_dict().items()
           if k in ("pserver_client_state", "layout", "worker_id",
                    "num_workers", "global_step")}
    opt.load_state_dict(old)
    bad = opt.state_dict()
    bad["param_groups"][0]["betas"] = (0.5, 0.999)
    with pytest.raises(ValueError, match=r"param group 0: betas is "
                       r"\(0.5, 0.999\); the shards' is \(0.9, 0.999\)"):
        opt.load_state_dict(bad)
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
