"""Issue 47 D: clip_scope="mean" clips the round's mean gradient by its
global norm on the shards (two shards, so the norm spans both), as DDP
with clip_grad_norm_ does: equal to torch.optim.AdamW on the clipped mean,
with and without overlap=True, on steps that clip and steps that do not;
refused where it cannot be served."""

import pytest
import torch

from test_torch import in_threads

import pserver
import pserver.torch

ADAMW = ("--optimizer=adam", "--bias_correction=true", "--lr=0.02",
         "--weight_decay=0.1", "--pull_codec=fp32")
RTOL, ATOL = 1e-5, 1e-6


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def loss_of(model, step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = 3 * torch.randn(8, 4, generator=g)
    y = torch.randint(0, 3, (8,), generator=g)
    return torch.nn.functional.cross_entropy(model(x), y)


@pytest.mark.parametrize("overlap", [False, True], ids=["", "overlap"])
def test_mean_clipping_is_ddps(shards, overlap):
    addrs = shards(2, 2, *ADAMW)
    models = [Net(), Net()]
    opts = [None, None]

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].parameters(), servers=addrs, worker_id=r,
            num_workers=2, push_codec="fp32", overlap=overlap,
            max_grad_norm=0.8, clip_scope="mean")

    in_threads(lambda: make(1), lambda: make(0))
    ref = Net()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.02, weight_decay=0.1)
    clipped = 0
    for step in range(6):
        for r, m in enumerate(models):
            loss_of(m, step, r).backward()
        for p, a, b in zip(ref.parameters(), models[0].parameters(),
                           models[1].parameters()):
            p.grad = (a.grad + b.grad) / 2
        norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.8)
        clipped += int(norm > 0.8)
        ref_opt.step()
        ref_opt.zero_grad()
        in_threads(*[o.step for o in opts])
        for o in opts:
            o.zero_grad()
        for m in models:
            for a, b in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    # Some steps clipped and some did not (the data's scale is chosen so).
    assert 0 < clipped < 6, clipped


def test_workers_that_clip_differently_are_refused(shards):
    """The second push of the round is refused naming both values; the
    round goes on without that worker once its lease (2 s) runs out."""
    addrs = shards(1, 2, *ADAMW, "--lease_timeout_seconds=2")
    models = [Net(), Net()]
    opts = [None, None]
    kinds = [dict(max_grad_norm=0.5, clip_scope="mean"), {}]

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].parameters(), servers=addrs, worker_id=r,
            num_workers=2, push_codec="fp32", **kinds[r])

    in_threads(lambda: make(1), lambda: make(0))
    for r, m in enumerate(models):
        loss_of(m, 0, r).backward()
    errors = []

    def step(r):
        try:
            opts[r].step()
        except pserver.Error as e:
            errors.append(str(e))

    in_threads(lambda: step(0), lambda: step(1))
    assert any("clip_norm is" in e and "every worker must clip the same"
               in e for e in errors), errors


def test_mean_clipping_is_refused_where_it_cannot_be_served(shards):
    with pytest.raises(ValueError, match="clip_scope is 'median'; expected "
                       "one of worker, mean"):
        pserver.torch.DistributedOptimizer(
            Net().parameters(), servers=["127.0.0.1:1"], worker_id=0,
            num_workers=1, clip_scope="median")
    with pytest.raises(ValueError, match="max_grad_norm is None"):
        pserver.torch.DistributedOptimizer(
            Net().parameters(), servers=["127.0.0.1:1"], worker_id=0,
            num_workers=1, clip_scope="mean")
    addrs = shards(1, 1, "--optimizer=onebit_adam", "--freeze_step=3")
    net = Net()
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match="the shards run onebit_adam"):
        pserver.torch.DistributedOptimizer(
            net.parameters(), servers=addrs, worker_id=0, num_workers=1,
            max_grad_norm=1.0, clip_scope="mean")
    for a, b in zip(net.parameters(), before):
        assert torch.equal(a, b)
