"""pserver.torch.DistributedOptimizer against real pserver_server processes."""

import faulthandler
import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch

import pserver
import pserver.torch

HERE = pathlib.Path(__file__).resolve().parent
# The folder holding the pserver package in use, for the worker processes.
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])


class Net(torch.nn.Module):
    """Two layers plus a frozen parameter (requires_grad=False)."""

    def __init__(self, seed, hidden=6):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(4, hidden)
        self.fc2 = torch.nn.Linear(hidden, 3)
        self.frozen = torch.nn.Parameter(torch.full((2,), float(seed)),
                                         requires_grad=False)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.frozen.sum()


def finish(procs):
    """Waits for the worker processes (killing any still running when a
    wait fails) and asserts each exited 0, showing its output if not."""
    try:
        outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text


def in_threads(*calls):
    """Runs the calls at once (each worker blocks in its round); re-raises."""
    errors, threads = [], []

    def run(f):
        try:
            f()
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    for f in calls:
        # Daemon threads: one that hangs fails its test (below) instead of
        # keeping the interpreter, and every later test, waiting.
        threads.append(threading.Thread(target=run, args=(f,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(60)
        if t.is_alive():
            # Where it hangs, in Python and (with the GIL released) below.
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        assert not t.is_alive(), f"{t.name} still running after 60 s"
    if errors:
        raise errors[0]


def grads(model):
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("flags, reference", [
    (("--optimizer=sgd", "--lr=0.1", "--momentum=0.9"),
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    (("--optimizer=adam", "--lr=0.01", "--beta1=0.9", "--beta2=0.999",
      "--eps=1e-8", "--bias_correction=true"),
     lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.999), eps=1e-8)),
], ids=["sgd", "adam"])
def test_steps_match_torch_optim_on_the_mean_gradient(shards, flags,
                                                      reference):
    """Two workers, fp32 both ways: each step equals torch.optim's step on
    the mean of the two workers' gradients (to fp32 rounding)."""
    addrs = shards(2, 2, *flags, "--pull_codec=fp32")
    models = [Net(seed=1), Net(seed=2)]
    opts = [None, None]

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].named_parameters(), servers=addrs, worker_id=r,
            num_workers=2, push_codec="fp32")

    in_threads(lambda: make(1), lambda: make(0))
    # The frozen parameter is not in the layout and stays each worker's own.
    assert opts[0].client.num_params == 4 * 6 + 6 + 6 * 3 + 3
    assert models[1].frozen.tolist() == [2.0, 2.0]
    ref = Net(seed=1)  # rank 0's initial weights are everyone's
    for m in models:
        for a, b in zip(m.fc1.parameters(), ref.fc1.parameters()):
            assert torch.equal(a, b)
    ref.frozen.data.copy_(models[0].frozen)
    models[1].frozen.data.copy_(models[0].frozen)
    ref_opt = reference([p for p in ref.parameters() if p.requires_grad])
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    for step in range(4):
        xs = [torch.randn(8, 4, generator=gen) for _ in models]
        ys = [torch.randint(0, 3, (8,), generator=gen) for _ in models]
        for m, x, y in zip(models, xs, ys):
            torch.nn.functional.cross_entropy(m(x), y).backward()
        mean = [(a + b) / 2 for a, b in zip(grads(models[0]),
                                            grads(models[1]))]
        for p, g in zip([p for p in ref.parameters() if p.requires_grad],
                        mean):
            p.grad = g
        ref_opt.step()
        in_threads(opts[0].step, opts[1].step)
        for o in opts:
            o.zero_grad()
        for m in models:
            for a, b in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
                worst = max(worst, (a - b).abs().max().item())
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(a, b)
        assert opts[0].global_step == step + 1
    print(f"largest difference from torch.optim after 4 steps: {worst:.3g}")


def test_two_worker_processes_train_an_mlp(shards, tmp_path):
    """2 worker processes, 2 shards, 1-bit Adam with 1-bit pushes and pulls:
    the loss falls and both workers end with identical parameters."""
    steps = 150
    addrs = shards(2, 2, "--optimizer=onebit_adam", "--lr=0.01",
                   "--freeze_step=30", "--bias_correction=true")
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2",
                   PSERVER_SERVERS=",".join(addrs), PYTHONPATH=os.pathsep.join(
                       [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "torch_worker.py"),
             str(tmp_path / f"w{rank}.pt"), str(steps)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    finish(procs)
    w = [torch.load(tmp_path / f"w{r}.pt") for r in range(2)]
    for k, v in w[0]["created"].items():
        assert torch.equal(w[0]["after_register"][k], v)
        assert torch.equal(w[1]["after_register"][k], v)
    assert not torch.equal(w[1]["created"]["0.weight"],
                           w[0]["created"]["0.weight"])
    for k in w[0]["final"]:
        assert torch.equal(w[0]["final"][k], w[1]["final"][k]), k
    for r in range(2):
        assert w[r]["global_step"] == steps
        assert w[r]["loss_after"] < 0.4 * w[r]["loss_before"], w[r]
        assert w[r]["accuracy"] > 0.9, w[r]
        s = w[r]["stats"]
        assert s["push_payload_bytes"] < s["push_fp32_bytes"] / 2, s
    print(f"loss {w[0]['loss_before']:.4f} -> {w[0]['loss_after']:.4f}, "
          f"accuracy {w[0]['accuracy']:.3f}, traffic ratio "
          f"{w[0]['stats']['compression_ratio']:.1f}x")


def test_other_model_is_refused_naming_the_tensor(shards):
    addrs = shards(1, 2, "--optimizer=sgd")
    a, b = Net(seed=1), Net(seed=1, hidden=7)
    pserver.torch.DistributedOptimizer(a.named_parameters(), servers=addrs,
                                       worker_id=0, num_workers=2)
    with pytest.raises(pserver.Error) as e:
        pserver.torch.DistributedOptimizer(b.named_parameters(),
                                           servers=addrs, worker_id=1,
                                           num_workers=2, retry_budget=5)
    assert "fc1.weight" in str(e.value)
    assert e.value.reason == "REJECT_REASON_LAYOUT_MISMATCH"


def test_bad_parameters_and_gradients(shards):
    addrs = shards(1, 1, "--optimizer=sgd", "--lr=0.1", "--pull_codec=fp32")
    m = Net(seed=3).double()
    with pytest.raises(TypeError, match="'fc1.weight' has dtype torch.float64"):
        pserver.torch.DistributedOptimizer(m.named_parameters(), servers=addrs,
                                           worker_id=0, num_workers=1)
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        pserver.torch.DistributedOptimizer(
            [("w", torch.zeros(3))], servers=addrs, worker_id=0,
            num_workers=1)
    m = Net(seed=3)
    opt = pserver.torch.DistributedOptimizer(m.named_parameters(),
                                             servers=addrs, worker_id=0,
                                             num_workers=1, push_codec="fp32")
    before = [p.clone() for p in m.parameters()]
    m(torch.randn(2, 4)).sum().backward()
    m.fc2.bias.grad[1] = float("inf")
    with pytest.raises(pserver.Error) as e:
        opt.step()
    assert e.value.code == "INVALID_ARGUMENT"
    for a, b in zip(m.parameters(), before):
        assert torch.equal(a, b)
    assert opt.global_step == 0
    m.fc2.bias.grad[1] = 0.0
    opt.step()
    assert opt.global_step == 1
    assert not torch.equal(m.fc1.weight, before[0])
    with pytest.raises(ValueError, match="layout is fixed"):
        opt.add_param_group({"params": [torch.zeros(1, requires_grad=True)]})


def test_init_reads_torchrun_variables_and_arguments_override():
    env = {"RANK": "1", "WORLD_SIZE": "3", "PSERVER_SERVERS": "a:1, b:2"}
    assert pserver.init(env=env) == {"servers": ["a:1", "b:2"],
                                     "worker_id": 1, "num_workers": 3}
    assert pserver.init(servers=["c:3"], worker_id=0, env=env) == {
        "servers": ["c:3"], "worker_id": 0, "num_workers": 3}
    with pytest.raises(ValueError, match="PSERVER_SERVERS"):
        pserver.init(env={})
    with pytest.raises(ValueError, match="RANK"):
        pserver.init(env=dict(env, RANK="x"))
    with pytest.raises(ValueError, match="worker_id .* is 3"):
        pserver.init(env=dict(env, RANK="3"))


class _Constructed(Exception):
    """Raised by a stand-in for pserver.Client with the options it got."""


def _client_options_given(monkeypatch, value, **kwargs):
    """The options DistributedOptimizer hands to Client with
    PSERVER_CLIENT_OPTIONS=value (None: unset); no shard is contacted."""
    def fake_client(servers, worker_id, num_workers, **options):
        raise _Constructed(options)

    if value is None:
        monkeypatch.delenv("PSERVER_CLIENT_OPTIONS", raising=False)
    else:
        monkeypatch.setenv("PSERVER_CLIENT_OPTIONS", value)
    monkeypatch.setattr(pserver.torch, "Client", fake_client)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(_Constructed) as got:
        pserver.torch.DistributedOptimizer(
            model.parameters(), servers=["127.0.0.1:1"], worker_id=0,
            num_workers=1, **kwargs)
    return got.value.args[0]


def test_client_options_from_the_environment_fill_what_is_not_given(
        monkeypatch):
    """PSERVER_CLIENT_OPTIONS (python3 -m pserver.launch --recipe) supplies
    the Client options the script does not pass; explicit ones win, but
    a push codec other than the recipe's is refused naming both (issue 47:
    the recipe's other options were chosen for its codec). Without it the
    push codec is the job's (empty: the shards announce it)."""
    assert _client_options_given(monkeypatch, None) == {
        "push_codec": "", "local_steps": 1}
    assert _client_options_given(monkeypatch, "") == {
        "push_codec": "", "local_steps": 1}
    recipe = ('{"push_codec": "topk", "k_fraction": 0.01, '
              '"momentum_masking": true, "schedule": "/run/s.txtpb"}')
    assert _client_options_given(monkeypatch, recipe) == {
        "push_codec": "topk", "k_fraction": 0.01, "momentum_masking": True,
        "schedule": "/run/s.txtpb", "local_steps": 1}
    assert _client_options_given(
        monkeypatch, recipe, push_codec="topk", k_fraction=0.05) == {
        "push_codec": "topk", "k_fraction": 0.05, "momentum_masking": True,
        "schedule": "/run/s.txtpb", "local_steps": 1}
    with pytest.raises(ValueError, match="push_codec is 'fp32' but the "
                       "launcher's recipe pushes 'topk' "
                       r"\(PSERVER_CLIENT_OPTIONS: .*\"momentum_masking\": "
                       r"true.*\); expected push_codec left out"):
        _client_options_given(monkeypatch, recipe, push_codec="fp32")
    assert _client_options_given(monkeypatch, '{"seed": 3}') == {
        "push_codec": "", "seed": 3, "local_steps": 1}


@pytest.mark.parametrize("value,message", [
    ("push_codec=topk", "PSERVER_CLIENT_OPTIONS is not JSON .*; expected a "
     "JSON object of pserver.Client options"),
    ('["topk"]', "PSERVER_CLIENT_OPTIONS is an array; expected a JSON "
     "object"),
    ('{"push_codec": "topk", "lr": 0.1}', "PSERVER_CLIENT_OPTIONS has the "
     "key 'lr', which is not a pserver.Client option nor outer_momentum; "
     "expected keys among "
     "push_codec, "),
    ('{"local_steps": 4}', "the key 'local_steps', which is not"),
])
def test_bad_client_options_in_the_environment_are_refused(
        monkeypatch, value, message):
    with pytest.raises(ValueError, match=message):
        _client_options_given(monkeypatch, value)


def test_the_environment_s_client_options_are_client_s():
    """pserver.env.CLIENT_OPTIONS is Client's keyword options but those
    DistributedOptimizer sets itself (read from Client's signature)."""
    import re
    from pserver.env import CLIENT_OPTIONS
    signature = pserver.Client.__init__.__doc__.split("\n")[0]
    names = re.findall(r"(\w+): ", signature)
    assert names[0] == "self"
    own = {"self", "servers", "worker_id", "num_workers", "local_steps",
           "beta1", "beta2", "eps"}
    assert sorted(CLIENT_OPTIONS) == sorted(set(names) - own)


def test_client_takes_cpu_tensors_and_refuses_others(shards):
    addrs = shards(1, 1, "--optimizer=sgd", "--momentum=0", "--lr=0.5",
                   "--pull_codec=fp32")
    c = pserver.Client(addrs, 0, 1, push_codec="fp32")
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    c.register(["w"], [[2, 3]], w)
    out = torch.zeros(2, 3)
    bad = [
        (torch.ones(6, dtype=torch.float64), TypeError,
         "gradient has dtype torch.float64; expected torch.float32"),
        (torch.ones(3, 2).t(), ValueError, "gradient is not contiguous"),
        (torch.ones(7), ValueError, "gradient holds 7 .*expected 6"),
        (torch.ones(6, dtype=torch.float16), TypeError, "torch.float16"),
        (torch.ones(6, device="meta"), ValueError,
         "gradient is a tensor on meta; expected a CPU tensor"),
    ]
    for g, error, words in bad:
        with pytest.raises(error, match=words):
            c.step(g, out)
        assert c.global_step == 0 and torch.equal(out, torch.zeros(2, 3))
    g = torch.ones(2, 3, requires_grad=True)  # detached, not copied
    assert c.step(g, out) == 1
    assert torch.equal(out, w - 0.5)


def test_local_steps_push_the_averaged_weight_change(shards):
    """local_steps=3 with an outer step that just averages (sgd, lr 1, no
    momentum) and fp32 both ways: after each round every worker holds the
    mean of the two workers' locally trained weights; global_step counts
    local steps."""
    addrs = shards(2, 2, "--optimizer=sgd", "--lr=1", "--momentum=0",
                   "--pull_codec=fp32")
    models = [Net(seed=1), Net(seed=1)]
    refs = [Net(seed=1), Net(seed=1)]  # the same two runs without pserver
    inner = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    ref_inner = [torch.optim.SGD(m.parameters(), lr=0.05) for m in refs]
    opts = [None, None]

    def make(r):
        opts[r] = pserver.torch.DistributedOptimizer(
            models[r].named_parameters(), servers=addrs, worker_id=r,
            num_workers=2, push_codec="fp32", local_steps=3,
            inner_optimizer=inner[r])

    in_threads(lambda: make(1), lambda: make(0))
    gen = torch.Generator().manual_seed(5)
    data = [torch.randn(4, 4, generator=gen) for _ in range(12)]

    def local(r, step, model, opt):
        loss = model(data[step] * (r + 1)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    for rnd in range(2):
        for k in range(3):
            step = rnd * 3 + k
            in_threads(*[lambda r=r: local(r, step, models[r], opts[r])
                         for r in range(2)])
            for r in range(2):
                local(r, step, refs[r], ref_inner[r])
        assert opts[0].global_step == opts[1].global_step == 3 * (rnd + 1)
        # The round's outcome: the mean of the two local results.
        with torch.no_grad():
            for pa, pb in zip(refs[0].parameters(), refs[1].parameters()):
                if pa.requires_grad:
                    mean = (pa + pb) / 2
                    pa.copy_(mean)
                    pb.copy_(mean)
        for r in range(2):
            for p, q in zip(models[r].parameters(), refs[r].parameters()):
                assert torch.allclose(p, q, atol=1e-6), (rnd, r)
    assert opts[0].client.global_step == 2  # the shards count rounds


def test_local_steps_arguments_and_a_mismatched_worker_are_refused(shards):
    addrs = shards(1, 2, "--optimizer=sgd", "--pull_codec=fp32")
    model = Net(seed=1)
    with pytest.raises(ValueError, match="inner_optimizer is NoneType"):
        pserver.torch.DistributedOptimizer(
            model.named_parameters(), servers=addrs, worker_id=0,
            num_workers=2, local_steps=4)
    with pytest.raises(ValueError, match="local_steps is 0; expected"):
        pserver.torch.DistributedOptimizer(
            model.named_parameters(), servers=addrs, worker_id=0,
            num_workers=2, local_steps=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="use overlap=False"):
        pserver.torch.DistributedOptimizer(
            model.named_parameters(), servers=addrs, worker_id=0,
            num_workers=2, local_steps=4, inner_optimizer=sgd, overlap=True)
    # Worker 0 installs the model with 4 local steps; worker 1 with 1 is
    # refused by the shard, naming the field.
    pserver.torch.DistributedOptimizer(
        model.named_parameters(), servers=addrs, worker_id=0, num_workers=2,
        push_codec="fp32", local_steps=4, inner_optimizer=sgd)
    other = Net(seed=1)
    with pytest.raises(pserver.Error, match="local_steps is 1; the job "
                       "pushes every 4 local steps"):
        pserver.torch.DistributedOptimizer(
            other.named_parameters(), servers=addrs, worker_id=1,
            num_workers=2, push_codec="fp32", retry_budget=5)


def test_a_scheduled_job_trains_through_the_optimizer(shards):
    """schedule= and run_length= reach the client: with the repository's
    staged 8/6/4-bit schedule (fractions of a 10-round run) the pushes
    switch codec at rounds 1 and 5, and each phase's pushes are smaller."""
    f = str(pathlib.Path(__file__).resolve().parents[2] / "deploy" /
            "schedules" / "staged_quantize.json")
    addrs = shards(1, 1, "--optimizer=adam", "--lr=0.01",
                   "--pull_codec=quantize", f"--schedule={f}")
    m = Net(seed=5, hidden=64)
    opt = pserver.torch.DistributedOptimizer(
        m.named_parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="quantize", schedule=f, run_length=10)
    phases, pushed = [], []
    x = torch.randn(8, 4)
    for _ in range(10):
        phases.append(opt.client.schedule_phase)
        before = opt.stats()["push_payload_bytes"]
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
        pushed.append(opt.stats()["push_payload_bytes"] - before)
    assert phases == [0, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    assert pushed[0] > pushed[1] > pushed[5]
