"""Local steps with the outer momentum on the workers
(DistributedOptimizer(outer_momentum=...)), against real pserver_server
processes: the same weights as the shards' momentum when nothing is
compressed, arguments and saved states refused by name, and a refused push
that leaves the momentum as it was."""

import pytest
import torch

import pserver
import pserver.torch
from test_torch import Net, in_threads

ROUNDS, H = 3, 3


def train(addrs, outer=None, nesterov=True):
    """Two workers, ROUNDS rounds of H local SGD steps each, fp32 both ways:
    the weights after each round (worker 0's; both hold the same)."""
    models = [Net(seed=1), Net(seed=1)]
    inner = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    opts = [None, None]
    extra = {} if outer is None else {"outer_momentum": outer,
                                      "outer_nesterov": nesterov}

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].named_parameters(), servers=addrs, worker_id=r,
            num_workers=2, push_codec="fp32", local_steps=H,
            inner_optimizer=inner[r], **extra)

    in_threads(lambda: make(1), lambda: make(0))
    gen = torch.Generator().manual_seed(7)
    data = [torch.randn(4, 4, generator=gen) for _ in range(ROUNDS * H)]

    def local(r, step):
        loss = models[r](data[step] * (r + 1)).pow(2).mean()
        loss.backward()
        opts[r].step()
        opts[r].zero_grad()

    after = []
    for step in range(ROUNDS * H):
        in_threads(*[lambda r=r: local(r, step) for r in range(2)])
        if (step + 1) % H == 0:
            after.append([p.detach().clone() for p in models[0].parameters()
                          if p.requires_grad])
    return after, opts, models


@pytest.mark.parametrize("nesterov", [True, False],
                         ids=["nesterov", "heavy_ball"])
def test_the_workers_momentum_is_the_shards_momentum_uncompressed(
        shards, nesterov):
    flag = f"--nesterov={'true' if nesterov else 'false'}"
    on_shards = shards(2, 2, "--optimizer=sgd", "--lr=0.7", "--momentum=0.9",
                       flag, "--pull_codec=fp32")
    on_workers = shards(2, 2, "--optimizer=sgd", "--lr=0.7", "--momentum=0",
                        "--pull_codec=fp32")
    want, _, _ = train(on_shards)
    got, opts, _ = train(on_workers, outer=0.9, nesterov=nesterov)
    for rnd, (w, g) in enumerate(zip(want, got)):
        for a, b in zip(w, g):
            assert torch.allclose(a, b, atol=1e-5), rnd
    # The momentum changed the path: not plain averaging.
    plain = shards(2, 2, "--optimizer=sgd", "--lr=0.7", "--momentum=0",
                   "--pull_codec=fp32")
    avg, _, _ = train(plain)
    assert any(not torch.allclose(a, b, atol=1e-4)
               for a, b in zip(avg[-1], got[-1]))
    # Saved with the optimizer, and restored into it.
    sd = opts[0].state_dict()
    key = pserver.torch._outer.OuterMomentum.KEY
    assert sd[key]["beta"] == 0.9 and sd[key]["nesterov"] == nesterov
    u = sd[key]["u"].clone()
    assert u.abs().sum() > 0
    opts[0]._outer.u.zero_()
    opts[0].load_state_dict(sd)
    assert torch.equal(opts[0]._outer.u, u)


def test_outer_momentum_arguments_are_refused(shards):
    addrs = shards(1, 1, "--optimizer=sgd", "--momentum=0",
                   "--pull_codec=fp32")
    model = Net(seed=1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad, match in [(1.0, r"outer_momentum is 1.0; expected a number in "
                        r"\[0, 1\)"),
                       (-0.1, "outer_momentum is -0.1"),
                       (True, "outer_momentum is True"),
                       ("0.9", "outer_momentum is '0.9'")]:
        with pytest.raises(ValueError, match=match):
            pserver.torch.DistributedOptimizer(
                model.named_parameters(), servers=addrs, worker_id=0,
                num_workers=1, local_steps=2, inner_optimizer=sgd,
                outer_momentum=bad)
    with pytest.raises(ValueError, match="outer_nesterov is 'yes'"):
        pserver.torch.DistributedOptimizer(
            model.named_parameters(), servers=addrs, worker_id=0,
            num_workers=1, local_steps=2, inner_optimizer=sgd,
            outer_momentum=0.9, outer_nesterov="yes")
    with pytest.raises(ValueError, match="outer_momentum is set but "
                       "local_steps is 1"):
        pserver.torch.DistributedOptimizer(
            model.named_parameters(), servers=addrs, worker_id=0,
            num_workers=1, outer_momentum=0.9)


def test_refused_push_and_state_leave_the_momentum_as_it_was(shards):
    addrs = shards(1, 1, "--optimizer=sgd", "--lr=0.7", "--momentum=0",
                   "--pull_codec=fp32")
    model = Net(seed=1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = pserver.torch.DistributedOptimizer(
        model.named_parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="fp32", local_steps=2, inner_optimizer=sgd,
        outer_momentum=0.8)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(3))
    for _ in range(2):  # one round
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    u = opt._outer.u.clone()
    assert u.abs().sum() > 0
    saved = opt.state_dict()
    # A non-finite weight change: the client refuses the push.
    model(x).pow(2).mean().backward()
    opt.step()
    with torch.no_grad():
        model.fc1.weight[0, 0] = float("nan")
    with pytest.raises(pserver.Error):
        opt.synchronize()
    assert torch.equal(opt._outer.u, u)
    # States that do not fit are refused by name, u unchanged.
    key = pserver.torch._outer.OuterMomentum.KEY
    wrong = dict(saved, **{key: dict(saved[key], u=torch.zeros(3))})
    with pytest.raises(ValueError, match=r"\['u'\] is torch.float32 of "
                       r"shape \[3\]; expected"):
        opt.load_state_dict(wrong)
    other = dict(saved, **{key: dict(saved[key], beta=0.9)})
    with pytest.raises(ValueError, match="'beta'\\] is 0.9; expected 0.8, "
                       "this optimizer's outer_momentum"):
        opt.load_state_dict(other)
    without = {k: v for k, v in saved.items() if k != key}
    with pytest.raises(ValueError, match="has no 'pserver_outer_momentum'"):
        opt.load_state_dict(without)
    assert torch.equal(opt._outer.u, u)


def test_a_recipes_outer_momentum_applies_to_local_steps_only(
        shards, monkeypatch):
    """PSERVER_CLIENT_OPTIONS' outer_momentum (the recipe lm-local's) is the
    outer momentum of local steps when the script passes none: the same
    weights as passing it; an explicit one wins; without local steps it is
    not used."""
    want, _, _ = train(shards(2, 2, "--optimizer=sgd", "--lr=0.7",
                              "--momentum=0", "--pull_codec=fp32"), outer=0.8)
    monkeypatch.setenv("PSERVER_CLIENT_OPTIONS", '{"outer_momentum": 0.8}')
    got, opts, _ = train(shards(2, 2, "--optimizer=sgd", "--lr=0.7",
                                "--momentum=0", "--pull_codec=fp32"))
    assert opts[0]._outer.beta == pytest.approx(0.8)
    for w, g in zip(want, got):
        assert all(torch.equal(a, b) for a, b in zip(w, g))
    _, opts, _ = train(shards(2, 2, "--optimizer=sgd", "--lr=0.7",
                              "--momentum=0", "--pull_codec=fp32"), outer=0.5)
    assert opts[0]._outer.beta == pytest.approx(0.5)
    addrs = shards(1, 1, "--optimizer=sgd", "--lr=0.1", "--pull_codec=fp32")
    model = Net(seed=1)
    opt = pserver.torch.DistributedOptimizer(
        model.named_parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="fp32", lr=0.1)
    assert opt._outer is None


def test_a_recipes_bad_outer_momentum_is_refused_naming_the_variable(
        shards, monkeypatch):
    addrs = shards(1, 1, "--optimizer=sgd", "--lr=0.7", "--momentum=0",
                   "--pull_codec=fp32")
    monkeypatch.setenv("PSERVER_CLIENT_OPTIONS", '{"outer_momentum": "0.85"}')
    model = Net(seed=1)
    with pytest.raises(ValueError, match=r"PSERVER_CLIENT_OPTIONS: "
                       r"outer_momentum is '0.85'; expected a number"):
        pserver.torch.DistributedOptimizer(
            model.named_parameters(), servers=addrs, worker_id=0,
            num_workers=1, push_codec="fp32", local_steps=2,
            inner_optimizer=torch.optim.SGD(model.parameters(), lr=0.05))
