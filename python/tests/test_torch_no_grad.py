"""Issue 47 D: a parameter whose .grad is None in a step is not updated
that step (no momentum, no weight decay, its own step count), as
torch.optim leaves it; one that only some workers lack takes the mean with
zeros for them, as DDP does. Checked against torch.optim.AdamW and SGD on a
model with a branch used every other step, under bsp and async, with and
without overlap=True, and for 1-bit Adam across its freeze."""

import pytest
import torch

from test_torch import in_threads

import pserver
import pserver.torch

RTOL, ATOL = 1e-5, 1e-6


class Branchy(torch.nn.Module):
    """A trunk used every step and a side head used only when asked."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.side = torch.nn.Linear(8, 3)

    def forward(self, x, use_side):
        h = torch.tanh(self.fc1(x))
        out = self.fc2(h)
        return out + self.side(h) if use_side else out


def loss_of(model, step, rank, use_side):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 4, generator=g)
    y = torch.randint(0, 3, (8,), generator=g)
    return torch.nn.functional.cross_entropy(model(x, use_side), y)


def adamw(ps):
    return torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1)


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1)


ADAMW = ("--optimizer=adam", "--bias_correction=true", "--lr=0.02",
         "--weight_decay=0.1", "--pull_codec=fp32")
SGD = ("--optimizer=sgd", "--lr=0.1", "--momentum=0.9", "--weight_decay=0.1",
       "--pull_codec=fp32")


def run(shards, flags, reference, workers, uses, overlap=False, steps=6):
    """`workers` DistributedOptimizers and one torch.optim reference on
    the mean gradient, `uses(step, rank)` saying whether that worker's
    forward takes the side head; the weights compared after every step.
    Returns the models and the side head's weights after each step."""
    addrs = shards(1, workers, *flags)
    models = [Branchy() for _ in range(workers)]
    opts = [None] * workers

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].named_parameters(), servers=addrs, worker_id=r,
            num_workers=workers, push_codec="fp32", overlap=overlap)

    in_threads(*[lambda r=r: make(r) for r in reversed(range(workers))])
    ref = Branchy()
    ref_opt = reference(ref.parameters())
    sides = []
    for step in range(steps):
        for r, m in enumerate(models):
            loss_of(m, step, r, uses(step, r)).backward()
        # The reference's gradient is the workers' mean, zeros for a worker
        # without one; None where no worker had one.
        for name, p in ref.named_parameters():
            gs = [dict(m.named_parameters())[name].grad for m in models]
            if all(g is None for g in gs):
                p.grad = None
            else:
                p.grad = sum(torch.zeros_like(p) if g is None else g
                             for g in gs) / workers
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        in_threads(*[o.step for o in opts])
        for o in opts:
            o.zero_grad(set_to_none=True)
        for m in models:
            for (name, a), b in zip(m.named_parameters(), ref.parameters()):
                torch.testing.assert_close(
                    a, b, rtol=RTOL, atol=ATOL,
                    msg=lambda s: f"{name} after step {step}: {s}")
        sides.append(models[0].side.weight.detach().clone())
    return models, sides


@pytest.mark.parametrize("flags, reference", [(ADAMW, adamw), (SGD, sgd)],
                         ids=["adamw", "sgd"])
@pytest.mark.parametrize("overlap", [False, True], ids=["", "overlap"])
def test_an_unused_branch_is_left_as_torch_optim_leaves_it(shards, flags,
                                                          reference, overlap):
    """Two workers (bsp): the side head is used by both on even steps, by
    neither on odd ones (not moved at all: no momentum, no weight decay),
    and by worker 0 alone on step 4 (the mean with zeros for worker 1)."""
    def uses(step, rank):
        return step % 2 == 0 and (step != 4 or rank == 0)

    _, sides = run(shards, flags, reference, 2, uses, overlap=overlap)
    for step in (1, 3, 5):
        assert torch.equal(sides[step], sides[step - 1]), step
    assert not torch.equal(sides[4], sides[3])


def test_an_unused_branch_is_not_stepped_under_async(shards):
    """One worker under async: each push is its own round."""
    _, sides = run(shards, (*ADAMW, "--consistency=async"), adamw, 1,
                   lambda step, rank: step % 2 == 0)
    for step in (1, 3, 5):
        assert torch.equal(sides[step], sides[step - 1]), step


def test_one_bit_adam_leaves_an_unused_branch_alone(shards):
    """1-bit Adam through its freeze (round 3), 1-bit pushes after it: the
    side head does not move on the steps it has no gradient, in either
    stage, and moves on the others."""
    addrs = shards(1, 2, "--optimizer=onebit_adam", "--freeze_step=3",
                   "--lr=0.01", "--weight_decay=0.1", "--pull_codec=fp32")
    models = [Branchy() for _ in range(2)]
    opts = [None, None]

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].named_parameters(), servers=addrs, worker_id=r,
            num_workers=2)

    in_threads(lambda: make(1), lambda: make(0))
    before = models[0].side.weight.detach().clone()
    for step in range(8):
        use = step % 2 == 0
        for r, m in enumerate(models):
            loss_of(m, step, r, use).backward()
        in_threads(opts[0].step, opts[1].step)
        for o in opts:
            o.zero_grad(set_to_none=True)
        now = models[0].side.weight.detach().clone()
        # fp32 pulls: the replica is the shards' weights.
        moved = (now - before).abs().max().item()
        if use:
            assert moved > 0, step
        else:
            assert moved == 0, (step, moved)
        before = now
    assert opts[0].client.stage == "OPTIMIZER_STAGE_COMPRESSION"


def test_a_buffer_or_a_bad_index_is_refused(shards):
    """The client call behind it refuses what is not a parameter tensor of
    the layout, nothing sent."""
    addrs = shards(1, 1, *SGD)
    model = Branchy()
    model.register_buffer("scale", torch.ones(3))
    opt = pserver.torch.DistributedOptimizer(
        model.named_parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="fp32", module=model)
    flat = opt._flat
    loss_of(model, 0, 0, True).backward()
    flat.check_sparse()
    for i in range(len(flat.params)):
        flat.copy_grad(i)
    flat.put_buffers(flat.grad)
    buffer = len(flat.params)
    with pytest.raises(pserver.Error, match=(
            r"no_gradient\[0\] is tensor 6 \('scale'\), a buffer; expected "
            r"parameter tensors only")):
        opt.client.step(flat.grad, flat.weights, no_gradient=[buffer])
    with pytest.raises(pserver.Error, match=(
            r"no_gradient\[1\] is 1; expected increasing tensor indices "
            r"below 7")):
        opt.client.step(flat.grad, flat.weights, no_gradient=[2, 1])
    assert opt.global_step == 0
    opt.step()
    assert opt.global_step == 1
