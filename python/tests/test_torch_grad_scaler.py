"""Issue 47 D: GradScaler with DistributedOptimizer. An inf or NaN in one
worker's gradient skips the round for every worker, and every worker's
scaler backs off, as under DDP (where every rank unscales the same
all-reduced inf): the run equals one process's torch.optim.AdamW on the mean
gradient under its own GradScaler, step by step, scales included.

torch 1.13 has no GradScaler on the CPU; the `cpu_scaler` fixture enables
torch's own class on it (python/tests/cpu_grad_scaler.py): everything
between GradScaler and the optimizer is torch's code."""

import math

import pytest
import torch

import cpu_grad_scaler
from test_torch import in_threads
from test_torch_clip_mean import ADAMW, ATOL, RTOL, Net, loss_of

import pserver.torch


@pytest.fixture
def cpu_scaler(monkeypatch):
    cpu_grad_scaler.enable(monkeypatch.setattr)
    return lambda: cpu_grad_scaler.CpuGradScaler(init_scale=2.0 ** 10,
                                                 growth_interval=2)


OVERFLOW = {2: 1, 5: 0}  # step -> the worker whose gradient overflows


@pytest.mark.parametrize("unscale_first", [False, True],
                         ids=["", "unscale_first"])
def test_one_workers_overflow_skips_the_round_for_all(
        shards, cpu_scaler, unscale_first):
    # A lease of 2 s: a worker left waiting (the bug) fails the test soon.
    addrs = shards(2, 2, *ADAMW, "--lease_timeout_seconds=2")
    models = [Net(), Net()]
    opts = [None, None]
    scalers = [cpu_scaler(), cpu_scaler()]

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].parameters(), servers=addrs, worker_id=r,
            num_workers=2, push_codec="fp32")

    in_threads(lambda: make(1), lambda: make(0))
    ref = Net()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.02, weight_decay=0.1)
    ref_scaler = cpu_scaler()

    def worker_step(r, step):
        scaler, opt = scalers[r], opts[r]
        scaler.scale(loss_of(models[r], step, r)).backward()
        if OVERFLOW.get(step) == r:
            models[r].fc1.weight.grad[0, 0] = math.inf
        if unscale_first:
            # The usual place: clip_grad_norm_ between unscale_ and step.
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    skipped, scales = 0, []
    for step in range(7):
        before = [p.detach().clone() for p in ref.parameters()]
        losses = [loss_of(ref, step, r) for r in range(2)]
        ref_scaler.scale((losses[0] + losses[1]) / 2).backward()
        if step in OVERFLOW:
            ref.fc1.weight.grad[0, 0] = math.inf
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        ref_opt.zero_grad()
        skipped += all(torch.equal(a, b)
                       for a, b in zip(before, ref.parameters()))
        scales.append(ref_scaler.get_scale())
        in_threads(lambda: worker_step(0, step), lambda: worker_step(1, step))
        for r, m in enumerate(models):
            for a, b in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
            assert scalers[r].get_scale() == ref_scaler.get_scale(), (
                step, r, scalers[r].get_scale(), ref_scaler.get_scale())
    assert skipped == len(OVERFLOW)
    # It grew after two clean steps and backed off at each overflow.
    assert scales == [1024, 2048, 1024, 1024, 2048, 1024, 1024], scales


def test_overlap_with_a_scaler_is_refused_with_nothing_sent(
        shards, cpu_scaler):
    addrs = shards(1, 1, *ADAMW)
    model = Net()
    opt = pserver.torch.DistributedOptimizer(
        model.parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="fp32", overlap=True)
    scaler = cpu_scaler()
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(loss_of(model, 0, 0)).backward()
    with pytest.raises(RuntimeError, match="overlap=True pushes gradients "
                       "as backward produces them, still scaled"):
        scaler.step(opt)
    assert opt.global_step == 0
    for a, b in zip(model.parameters(), before):
        assert torch.equal(a, b)


def test_an_overflow_under_async_skips_that_push_only(shards, cpu_scaler):
    addrs = shards(1, 1, *ADAMW, "--consistency=async")
    model = Net()
    opt = pserver.torch.DistributedOptimizer(
        model.parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="fp32")
    scaler = cpu_scaler()
    for step in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss_of(model, step, 0)).backward()
        if step == 1:
            model.fc2.bias.grad[0] = math.nan
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        same = all(torch.equal(a, b)
                   for a, b in zip(before, model.parameters()))
        assert same == (step == 1), step
        assert scaler.get_scale() == (scale / 2 if step == 1 else scale)
    assert opt.global_step == 3  # the skipped round is still a round


def test_an_overflow_with_local_steps_skips_that_local_step(shards,
                                                            cpu_scaler):
    """local_steps=2 with an inner SGD: the local step with an inf is not
    taken (nor counted toward the synchronisation), as torch.optim's under
    the scaler; the next two synchronise."""
    addrs = shards(1, 1, "--optimizer=sgd", "--lr=1", "--momentum=0",
                   "--pull_codec=fp32")
    model = Net()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = pserver.torch.DistributedOptimizer(
        model.parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="fp32", local_steps=2, inner_optimizer=inner)
    scaler = cpu_scaler()
    moved = []
    for step in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss_of(model, step, 0)).backward()
        if step == 0:
            model.fc1.bias.grad[0] = math.inf
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        moved.append(not all(torch.equal(a, b)
                             for a, b in zip(before, model.parameters())))
    assert moved == [False, True, True], moved
    assert opt.global_step == 2  # one round of 2 local steps
    assert scaler.get_scale() == 2.0 ** 10  # halved, then grown after 2
