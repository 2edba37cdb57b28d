"""DistributedOptimizer as a torch.optim.Optimizer (issue 27): param groups
and errors, against real pserver_server processes and real torch.optim;
also the model, groups and helpers test_torch_schedulers.py (schedulers,
the golden two-worker run, state_dict) and test_torch_tensors.py import."""

import math

import pytest
import torch

from test_torch import in_threads

import pserver
import pserver.torch

FP32_ADAM = ("--optimizer=adam", "--pull_codec=fp32")


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
