"""overlap=True: gradients pushed from hooks during backward, and what a
script does between backward and step() (clip_grad_norm_, a changed lr)."""

import pytest
import torch

import pserver
import pserver.torch
from test_torch import Net


def batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    return (torch.randn(16, 4, generator=gen),
            torch.randint(0, 3, (16,), generator=gen))


def make(addrs, model, **kw):
    return pserver.torch.DistributedOptimizer(
        model.named_parameters(), servers=addrs, worker_id=0, num_workers=1,
        **kw)


def test_overlapped_steps_equal_plain_steps_and_refuse_accumulation(shards):
    """overlap=True pushes each parameter's gradient from its hook during
    backward (several chunks per shard here) from the second step on (the
    first only copies: see the clipping test); the weights after 1-bit
    Adam steps are bit-identical to overlap=False's. Two backward passes in
    one step are refused with overlap=True (gradient accumulation needs
    overlap=False)."""
    finals = []
    for overlap in (False, True):
        addrs = shards(2, 1, "--optimizer=onebit_adam", "--freeze_step=2",
                       "--chunk_elements=1024")
        model = Net(seed=3, hidden=600)  # 4803 parameters: 3 chunks a shard
        opt = make(addrs, model, overlap=overlap)
        for step in range(4):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            # The hooks started the step during backward.
            assert opt.client.in_step == (overlap and step > 0)
            opt.step()
            assert not opt.client.in_step
            assert opt.global_step == step + 1
        finals.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*finals):
        assert torch.equal(a, b)
    addrs = shards(1, 1, "--optimizer=sgd")
    model = Net(seed=3)
    opt = make(addrs, model, overlap=True)
    x, y = batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="overlap=False"):
        torch.nn.functional.cross_entropy(model(x), y).backward()


@pytest.mark.parametrize("first_clip", [0, 3])
def test_clip_grad_norm_between_backward_and_step(shards, first_clip):
    """torch's clip_grad_norm_ multiplies the gradients in place, by 1.0
    while the norm is under its threshold. A script that clips from its
    first step (first_clip 0, the threshold crossed mid-run only) is
    refused at that step with nothing sent: weights and step unchanged,
    whichever way the threshold falls. One that starts clipping after the
    push went out (first_clip 3) gets that step completed as it was pushed
    and an error saying so; either way the optimizer goes on working, and
    overlap=False with clip_grad_norm_ and max_grad_norm= with overlap=True
    both train."""
    addrs = shards(1, 1, "--optimizer=sgd", "--lr=0.1", "--momentum=0",
                   "--pull_codec=fp32")
    model = Net(seed=3)
    opt = make(addrs, model, overlap=True, push_codec="fp32")
    for step in range(6):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if step < first_clip:
            opt.step()
            continue
        before = [p.detach().clone() for p in model.parameters()]
        # Under the threshold on even steps (a multiplication by 1.0: the
        # values stay), clipping on odd ones.
        norm = float(torch.stack([p.grad.norm() for p in model.parameters()
                                  if p.grad is not None]).norm())
        threshold = norm * (2.0 if step % 2 == 0 else 0.5)
        grads = [p.grad.clone() for p in model.parameters()
                 if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(model.parameters(), threshold)
        same = all(torch.equal(a, p.grad) for a, p in zip(
            grads, [p for p in model.parameters() if p.grad is not None]))
        assert same == (step % 2 == 0)
        with pytest.raises(RuntimeError) as e:
            opt.step()
        text = str(e.value)
        assert "changed after backward handed it over" in text
        assert "clip with max_grad_norm=, or use overlap=False" in text
        moved = any(not torch.equal(a, p)
                    for a, p in zip(before, model.parameters()))
        if first_clip == 0:
            assert text.endswith("(nothing was sent)"), text
            assert opt.global_step == 0 and not moved
        else:
            assert text.endswith("(this step completed as it was pushed)")
            assert opt.global_step == first_clip + 1 and moved
        break
    # Usable after either: the next step goes through.
    x, y = batch(9)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    assert opt.global_step == (1 if first_clip == 0 else first_clip + 2)
    assert not opt.client.in_step


def test_lr_changed_between_backward_and_step_completes_then_raises(shards):
    """With overlap=True a group's lr goes with the first gradient: one
    changed between backward and step() is reported after the round
    completed with the lr it started with; the optimizer goes on."""
    addrs = shards(1, 1, "--optimizer=sgd", "--momentum=0",
                   "--pull_codec=fp32")
    model = Net(seed=3)
    opt = make(addrs, model, overlap=True, push_codec="fp32", lr=0.1)
    for step in range(2):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if step == 1:
            assert opt.client.in_step
            opt.param_groups[0]["lr"] = 0.5
            with pytest.raises(RuntimeError,
                               match=r"changed after backward started the "
                               r"step .* \(this step completed as it was "
                               r"pushed\)$"):
                opt.step()
        else:
            opt.step()
    assert opt.global_step == 2 and not opt.client.in_step
    x, y = batch(2)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # now with lr 0.5, set before backward
    assert opt.global_step == 3
