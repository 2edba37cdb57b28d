"""DistributedOptimizer as a torch.optim.Optimizer (issue 27): param groups,
schedulers, state_dict and errors, against real pserver_server processes
and real torch.optim."""

import gc
import io
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from test_torch import finish, in_threads

import pserver
import pserver.torch
import optim_worker  # python/tests/, on sys.path under pytest

HERE = pathlib.Path(__file__).resolve().parent
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])
FP32_ADAM = ("--optimizer=adam", "--pull_codec=fp32")
# The shards compute x -= lr * (m^ / (sqrt(v^) + eps) + wd * x) in float32;
# torch.optim.AdamW does x *= 1 - lr * wd, then the Adam step, with its
# own order of operations: equal to float32 rounding, not bit for bit.
RTOL, ATOL = 1e-5, 1e-6


class Net(torch.nn.Module):
    def __init__(self, seed=1):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.frozen


def groups(net):
    """Weight decay 0.1 on the matrices, 0.0 on the biases; the frozen
    parameter stays in its group, as model.parameters() would give it."""
    return [{"params": [net.fc1.weight, net.fc2.weight, net.frozen],
             "weight_decay": 0.1},
            {"params": [net.fc1.bias, net.fc2.bias], "weight_decay": 0.0}]


def batch(step, rank=0):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,),
                                                         generator=g)


def loss_of(net, step, rank=0):
    x, y = batch(step, rank)
    return torch.nn.functional.cross_entropy(net(x), y)


def make(params, addrs, rank=0, world=1, **kw):
    return pserver.torch.DistributedOptimizer(
        params, servers=addrs, worker_id=rank, num_workers=world,
        push_codec=kw.pop("push_codec", "fp32"), **kw)


def layout_names(opt):
    return [n for n, _ in opt.state_dict()["layout"]]


def test_params_as_torch_optim_takes_them(shards):
    """Tensors, pairs and group dicts; names generated, given or the
    module's; frozen tensors kept in their group but out of the layout;
    missing entries filled from the shards' flags."""
    flags = ("--optimizer=adam", "--lr=0.004", "--beta1=0.8",
             "--weight_decay=0.02", "--pull_codec=fp32")
    net = Net()
    opt = make(net.parameters(), shards(1, 1, *flags))
    # named_parameters() order: the module's own (frozen) first.
    assert layout_names(opt) == [f"group0.param{i}" for i in range(1, 5)]
    g = opt.param_groups[0]
    assert len(g["params"]) == 5  # the frozen one included
    assert (g["lr"], g["weight_decay"], g["betas"], g["eps"]) == (
        0.004, 0.02, (0.8, 0.999), 1e-8)
    assert opt.defaults["lr"] == 0.004 and opt.defaults["betas"] == (0.8,
                                                                    0.999)
    assert opt.client.num_params == 4 * 8 + 8 + 8 * 3 + 3

    opt = make(net.named_parameters(), shards(1, 1, *flags), lr=0.01)
    assert layout_names(opt) == ["fc1.weight", "fc1.bias", "fc2.weight",
                                 "fc2.bias"]
    assert opt.param_groups[0]["lr"] == 0.01

    gs = groups(net)
    gs[1]["lr"] = 0.03
    opt = make(gs, shards(1, 1, *flags), module=net, buffers="none")
    assert layout_names(opt) == ["fc1.weight", "fc2.weight", "fc1.bias",
                                 "fc2.bias"]
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [
        (0.004, 0.1), (0.03, 0.0)]

    opt = make([{"params": [("w1", net.fc1.weight)], "lr_scale": 0.5},
                {"params": [("b1", net.fc1.bias), ("w2", net.fc2.weight),
                            ("b2", net.fc2.bias)]}],
               shards(1, 1, *flags), betas=(0.8, 0.999), eps=1e-8)
    assert layout_names(opt) == ["w1", "b1", "w2", "b2"]
    assert [g["lr"] for g in opt.param_groups] == [0.002, 0.004]

    tied = torch.nn.Sequential(torch.nn.Embedding(5, 4),
                               torch.nn.Linear(4, 5, bias=False))
    tied[1].weight = tied[0].weight  # one tensor, one name
    opt = make(tied.parameters(), shards(1, 1, *flags), module=tied)
    assert layout_names(opt) == ["0.weight"]


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


def params_of(net):
    return [p.detach().clone() for p in net.parameters()]


def unchanged(opt, net, before, step):
    assert opt.global_step == step
    for a, b in zip(net.parameters(), before):
        assert torch.equal(a, b)


def test_construction_errors_name_the_parameter_or_group(shards):
    net = Net()
    addrs = shards(1, 1, *FP32_ADAM, "--beta1=0.9", "--eps=1e-8")
    cases = [
        (lambda: make(Net().double().parameters(), addrs), TypeError,
         r"'group0.param1' has dtype torch.float64; expected torch.float32, "
         r"torch.bfloat16 or torch.float16"),
        (lambda: make(net.fc1.weight, addrs), TypeError,
         "params is a (Tensor|Parameter); expected an iterable"),
        (lambda: make({"params": [net.fc1.weight]}, addrs), TypeError,
         "params is a dict"),
        (lambda: make([{"params": {net.fc1.weight}}], addrs), TypeError,
         "params is a set"),
        (lambda: make([net.fc1.weight, net.fc1.weight], addrs), ValueError,
         "'group0.param1' is given twice \\(also as 'group0.param0'\\)"),
        (lambda: make(net.parameters(), addrs, lr=-1.0), ValueError,
         "lr is -1.0; expected a finite number >= 0"),
        (lambda: make([{"params": [net.fc1.weight], "lr": float("nan")}],
                      addrs), ValueError,
         "param group 0: lr is nan; expected a finite number >= 0"),
        (lambda: make([{"params": [net.fc1.weight], "lr": 0.1,
                        "lr_scale": 2}], addrs), ValueError,
         "param group 0 gives both lr and lr_scale"),
        (lambda: make(net.parameters(), addrs, buffers="average"),
         ValueError, "buffers is 'average' but module is None"),
        (lambda: make(net.parameters(), addrs, module=net, buffers="all"),
         ValueError, "buffers is 'all'; expected one of average"),
        (lambda: make(net.parameters(), addrs, max_grad_norm=-1),
         ValueError, "max_grad_norm is -1.0"),
    ]
    emb = torch.nn.Embedding(5, 2, sparse=True)
    cases.append((lambda: make(emb.parameters(), addrs, module=emb),
                  ValueError, "'weight' belongs to an embedding with "
                  "sparse=True"))
    for call, error, words in cases:
        with pytest.raises(error, match=words):
            call()
    # Issue 47: betas and eps against a shard flag are refused by the
    # shards at Register, naming both, the parameters unchanged.
    net.fc1.weight.data.add_(1.0)
    before = params_of(net)
    with pytest.raises(pserver.Error, match=r"beta1 is 0.8 \(the worker's "
                       r"optimizer\); this job runs 0.9 \(--beta1 on the "
                       r"shards\)") as e:
        make(net.named_parameters(), addrs, betas=(0.8, 0.999))
    assert e.value.code == "FAILED_PRECONDITION"
    unchanged(make(net.named_parameters(), addrs), net, before, 0)
    # Groups that give different ones are refused before any shard is
    # contacted (the shards run one).
    with pytest.raises(ValueError, match=r"param group 1: eps is 1e-06; "
                       r"param group 0's is 1e-08; expected one eps"):
        make([{"params": [net.fc1.weight], "eps": 1e-8},
              {"params": [net.fc1.bias], "eps": 1e-6}],
             ["127.0.0.1:1"])
    sgd = shards(1, 1, "--optimizer=sgd")
    with pytest.raises(ValueError, match="betas is .*; the shards run "
                       "--optimizer=sgd, which has no betas"):
        make(net.parameters(), sgd, betas=(0.9, 0.999))


def test_betas_and_eps_of_the_script_are_what_the_shards_run(shards):
    """Issue 47: with --beta1/--beta2/--eps left out, the first worker's
    optimizer sets them (nanoGPT's betas=(0.9, 0.95) need no launcher
    flag); a later worker with others is refused naming both; a job whose
    script gives none runs the defaults."""
    addrs = shards(1, 2, *FP32_ADAM)
    net = Net()
    first = make(net.named_parameters(), addrs, world=2, betas=(0.9, 0.95),
                 eps=1e-6)
    config = first.client.shard_config
    assert (config["beta1"], config["beta2"]) == pytest.approx((0.9, 0.95))
    assert config["eps"] == pytest.approx(1e-6)
    assert first.param_groups[0]["betas"] == (0.9, 0.95)
    with pytest.raises(pserver.Error, match=r"beta2 is 0.999 \(the worker's "
                       r"optimizer\); this job runs 0.95 \(set by the first "
                       r"worker's optimizer\)"):
        make(Net().named_parameters(), addrs, rank=1, world=2,
             betas=(0.9, 0.999), retry_budget=5)
    # Another job, no betas anywhere: the defaults, filled into the groups.
    plain = make(Net().named_parameters(), shards(1, 1, *FP32_ADAM))
    assert plain.param_groups[0]["betas"] == (0.9, 0.999)
    assert plain.param_groups[0]["eps"] == 1e-8


def test_step_errors_send_nothing_and_change_nothing(shards):
    """A bad scheduler value, cycled betas, a sparse gradient: ValueError
    at step() naming it, the shards' step and the parameters unchanged;
    the same step succeeds once fixed. add_param_group is refused."""
    for overlap in (False, True):
        emb = torch.nn.Embedding(6, 3, sparse=True)
        net = Net()
        addrs = shards(1, 1, *FP32_ADAM)
        opt = make(groups(net) + [{"params": [("emb", emb.weight)]}],
                   addrs, lr=0.01, overlap=overlap)
        before = params_of(net)
        bad = [("lr", float("nan"), r"param_groups\[1\]\['lr'\] is nan"),
               ("lr", -0.5, r"param_groups\[1\]\['lr'\] is -0.5"),
               ("weight_decay", float("inf"),
                r"param_groups\[1\]\['weight_decay'\] is inf"),
               ("betas", (0.95, 0.999), r"param_groups\[1\]\['betas'\] is "
                r"\(0.95, 0.999\); the shards' is \(0.9, 0.999\) .*"
                "cycle_momentum=False")]
        for key, value, words in bad:
            good = opt.param_groups[1][key]
            opt.param_groups[1][key] = value
            loss_of(net, 0).backward()
            with pytest.raises(ValueError, match=words):
                opt.step()
            unchanged(opt, net, before, 0)
            opt.param_groups[1][key] = good
            opt.zero_grad()
        emb(torch.tensor([1, 2])).sum().backward()
        loss_of(net, 0).backward()
        with pytest.raises(ValueError, match="gradient of 'emb' is sparse"):
            opt.step()
        unchanged(opt, net, before, 0)
        opt.zero_grad(set_to_none=True)
        loss_of(net, 0).backward()
        opt.step()
        assert opt.global_step == 1
        assert not torch.equal(net.fc1.weight, before[0])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1,
                                                total_steps=5)
    assert opt.param_groups[0]["betas"][0] != 0.9  # cycled
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        opt.step()
    del sched
    with pytest.raises(ValueError, match="layout is fixed"):
        opt.add_param_group({"params": [torch.zeros(1, requires_grad=True)]})


def test_workers_that_disagree_on_the_lr_are_refused(shards):
    """Worker 0 sends lr 0.5, worker 1 lr 0.25 in the same round: the later
    push is refused (FAILED_PRECONDITION, naming both values), that worker
    unchanged; sending the same lr then completes the round."""
    addrs = shards(1, 2, "--optimizer=sgd", "--momentum=0",
                   "--pull_codec=fp32")
    nets = [Net(), Net()]
    opts = [None, None]

    def construct(r):
        opts[r] = make(nets[r].parameters(), addrs, rank=r, world=2,
                       lr=(0.5, 0.25)[r])

    in_threads(lambda: construct(0), lambda: construct(1))
    errors = []

    def work(r):
        loss_of(nets[r], 0, r).backward()
        before = params_of(nets[r])
        try:
            opts[r].step()
        except pserver.Error as e:
            errors.append((r, e))
            unchanged(opts[r], nets[r], before, 0)
            opts[r].param_groups[0]["lr"] = (0.5, 0.25)[1 - r]
            opts[r].step()

    in_threads(lambda: work(0), lambda: work(1))
    assert len(errors) == 1, errors
    r, e = errors[0]
    assert e.code == "FAILED_PRECONDITION"
    assert e.reason == "REJECT_REASON_HYPER_MISMATCH"
    for words in (f"worker {r}", f"worker {1 - r}", "lr 0.5", "lr 0.25"):
        assert words in str(e), str(e)
    assert opts[0].global_step == opts[1].global_step == 1
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)


def test_client_set_hyper_checks_its_values(shards):
    addrs = shards(1, 1, "--optimizer=sgd", "--pull_codec=fp32")
    c = pserver.Client(addrs, 0, 1, push_codec="fp32")
    c.register(["a", "b"], [[2], [3]], torch.zeros(5), groups=[0, 1],
               group_specs=[{}, {"lr_scale": 2.0}])
    assert c.shard_config["optimizer"] == "sgd"
    for values, words in (([(0.1, 0.0)], "1 entries; expected 0 or 2"),
                          ([(0.1, 0.0), (math.nan, 0.0)],
                           r"hyper\[1\]\.lr is nan"),
                          ([(0.1, -1.0), (0.1, 0.0)],
                           r"hyper\[0\]\.weight_decay is -1")):
        with pytest.raises(ValueError, match=words):
            c.set_hyper(values)
    c.set_hyper([(0.5, 0.0), (0.25, 0.0)])
    out = torch.zeros(5)
    c.step(torch.ones(5), out)
    assert out.tolist() == [-0.5, -0.5, -0.25, -0.25, -0.25]
