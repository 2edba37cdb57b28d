"""DistributedOptimizer's tensors (issue 27): module buffers averaged or
broadcast through the shards, bf16/fp16 and CUDA parameters, and
max_grad_norm, against real pserver_server processes and torch."""

import pytest
import torch

import pserver

from test_torch_optim import in_threads, make

FP32_ADAM = ("--optimizer=adam", "--pull_codec=fp32")
# sgd, lr 1, no momentum: the outer step of local steps is the mean.
AVERAGING = ("--optimizer=sgd", "--lr=1", "--momentum=0", "--pull_codec=fp32")


class BNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc1 = torch.nn.Linear(4, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def data(step, rank):
    """Each worker's own distribution (shifted by rank): its BatchNorm
    statistics differ from the other's."""
    g = torch.Generator().manual_seed(10 * step + rank)
    x = torch.randn(16, 4, generator=g) * (1 + rank) + 2 * rank
    return x, (x[:, 0] > x[:, 1]).long() + (x[:, 2] > 2 * rank).long()


def buffers(net):
    return {n: b.clone() for n, b in net.named_buffers()}


ONEBIT = ("--optimizer=onebit_adam", "--freeze_step=1", "--pull_codec=onebit")


@pytest.mark.parametrize("mode, options, flags", [
    ("average", {}, FP32_ADAM), ("broadcast", {}, FP32_ADAM),
    ("none", {}, FP32_ADAM), ("average", {"overlap": True}, FP32_ADAM),
    ("average", {"local_steps": 2}, AVERAGING),
    ("average", {"push_codec": "onebit"}, ONEBIT)],
    ids=["average", "broadcast", "none", "average-overlap",
         "average-local-steps", "average-onebit"])
def test_buffers_follow_the_mode(shards, mode, options, flags):
    """Two workers, a BatchNorm model, different data: after each
    synchronisation every worker's buffers are the mean of what the workers
    held ("average"), rank 0's ("broadcast") or their own ("none"), also
    when the parameters travel 1-bit; in the first two every worker then
    evaluates the same model to the same accuracy."""
    local = options.get("local_steps", 1)
    addrs = shards(2, 2, *flags)
    nets = [BNNet(), BNNet()]
    opts = [None, None]

    def construct(r):
        kw = dict(options)
        if local > 1:
            kw["inner_optimizer"] = torch.optim.SGD(nets[r].parameters(),
                                                    lr=0.05)
        opts[r] = make(nets[r].parameters(), addrs, rank=r, world=2,
                       module=nets[r], buffers=mode, **kw)

    in_threads(lambda: construct(1), lambda: construct(0))
    names = [n for n, _ in opts[0].state_dict()["layout"]]
    if mode == "none":
        assert names == ["fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                         "fc2.weight", "fc2.bias"]
    else:
        assert names[-3:] == ["bn.running_mean", "bn.running_var",
                              "bn.num_batches_tracked"]
    held = [None, None]

    def work(r, step):
        x, y = data(step, r)
        torch.nn.functional.cross_entropy(nets[r](x), y).backward()
        held[r] = buffers(nets[r])  # what this worker pushes
        opts[r].step()
        opts[r].zero_grad()

    for step in range(4):
        in_threads(lambda: work(0, step), lambda: work(1, step))
        after = [buffers(n) for n in nets]
        synced = (step + 1) % local == 0
        for name in after[0]:
            a, b = after[0][name], after[1][name]
            if mode == "none" or not synced:
                assert torch.equal(a, held[0][name]), name
                assert torch.equal(b, held[1][name]), name
                if name != "bn.num_batches_tracked":
                    assert not torch.equal(a, b), name
                continue
            assert torch.equal(a, b), name
            if mode == "broadcast":
                assert torch.equal(a, held[0][name]), name
            else:
                mean = (held[0][name].double() + held[1][name]) / 2
                if a.is_floating_point():
                    torch.testing.assert_close(a, mean.float(), rtol=1e-6,
                                               atol=1e-7)
                else:
                    assert torch.equal(a, mean.round().long()), name
        assert int(after[0]["bn.num_batches_tracked"]) == step + 1
    for p, q in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(p, q)
    x, y = data(99, 0)
    x = torch.cat([x, data(99, 1)[0]])
    logits = []
    for n in nets:
        n.eval()
        with torch.no_grad():
            logits.append(n(x))
    if mode == "none":
        assert not torch.equal(logits[0], logits[1])
    else:
        assert torch.equal(logits[0], logits[1])


class CastNet(torch.nn.Module):
    """Parameters held in `dtype`, the arithmetic in float32 (CPU torch has
    no float16 matmul): the gradients arrive in `dtype`, as on a GPU."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(4)
        self.l1 = torch.nn.Linear(4, 16).to(dtype)
        self.l2 = torch.nn.Linear(16, 3).to(dtype)

    def forward(self, x):
        linear = torch.nn.functional.linear
        h = linear(x, self.l1.weight.float(), self.l1.bias.float())
        return linear(torch.tanh(h), self.l2.weight.float(),
                      self.l2.bias.float())


def bf16_native():
    torch.manual_seed(4)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 3)).to(torch.bfloat16)
    return net, lambda x: net(x.to(torch.bfloat16)).float()


@pytest.mark.parametrize("kind", ["bfloat16", "float16-cast",
                                  "bfloat16-cast"])
def test_low_precision_parameters_keep_an_fp32_master(shards, kind):
    """bf16 / fp16 parameters train; the shards keep fp32 weights, and
    after each step every parameter is that fp32 replica rounded to its
    dtype. The first step equals torch.optim.Adam on fp32 master weights
    with the low-precision gradient."""
    if kind == "bfloat16":
        net, run = bf16_native()
        dtype = torch.bfloat16
    else:
        dtype = getattr(torch, kind.split("-")[0])
        net = CastNet(dtype)
        run = net
    addrs = shards(1, 1, *FP32_ADAM, "--lr=0.02")
    master = [p.detach().float().requires_grad_() for p in net.parameters()]
    ref = torch.optim.Adam(master, lr=0.02)
    opt = make(net.named_parameters(), addrs)
    replica = torch.empty(opt.client.num_params)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    losses = []
    for step in range(20):
        loss = torch.nn.functional.cross_entropy(run(x), y)
        losses.append(loss.item())
        loss.backward()
        if step == 0:
            for m, p in zip(master, net.parameters()):
                assert p.grad.dtype == dtype
                m.grad = p.grad.float()
            ref.step()
        opt.step()
        opt.zero_grad()
        opt.client.copy_weights_into(replica)
        at = 0
        for p in net.parameters():
            r = replica[at:at + p.numel()].view(p.shape)
            at += p.numel()
            assert p.dtype == dtype
            assert torch.equal(p, r.to(dtype))
        if step == 0:
            torch.testing.assert_close(
                replica, torch.cat([m.detach().reshape(-1) for m in master]),
                rtol=1e-5, atol=1e-6)
    assert losses[-1] < 0.8 * losses[0], losses
    assert not torch.equal(replica.to(dtype).float(), replica)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: the CUDA path (pinned host "
                    "buffers, copies to and from the device) needs one")
def test_cuda_parameters_train_as_on_the_cpu(shards):
    finals = []
    for device, overlap in (("cpu", False), ("cuda", False), ("cuda", True)):
        net = BNNet().to(device)
        opt = make(net.parameters(), shards(1, 1, *FP32_ADAM), lr=0.01,
                   module=net, overlap=overlap)
        for step in range(5):
            x, y = data(step, 0)
            torch.nn.functional.cross_entropy(
                net(x.to(device)), y.to(device)).backward()
            opt.step()
            opt.zero_grad()
        assert all(p.device.type == device for p in net.parameters())
        assert all(b.device.type == device for b in net.buffers())
        finals.append([t.detach().cpu() for t in net.state_dict().values()])
    for other in finals[1:]:
        for a, b in zip(finals[0], other):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_max_grad_norm_equals_clip_grad_norm_then_step(shards):
    """max_grad_norm (plain and overlapped) clips the worker's gradient as
    clip_grad_norm_ between backward and step does, bit for bit, leaving
    the BatchNorm buffers (in the layout) out of the norm."""
    finals, norms = [], []
    for variant in ("clip_grad_norm_", "max_grad_norm", "overlap"):
        net = BNNet()
        clip = None if variant == "clip_grad_norm_" else 0.25
        opt = make(net.parameters(), shards(1, 1, *AVERAGING), module=net,
                   max_grad_norm=clip, overlap=variant == "overlap")
        seen = []
        for step in range(3):
            x, y = data(step, 1)
            torch.nn.functional.cross_entropy(net(x * 3), y).backward()
            if clip is None:
                seen.append(float(torch.nn.utils.clip_grad_norm_(
                    net.parameters(), 0.25)))
            opt.step()
            if clip is not None:
                seen.append(opt.last_grad_norm)
            opt.zero_grad()
        finals.append([t.clone() for t in net.state_dict().values()])
        norms.append(seen)
    assert norms[0] == norms[1] == norms[2]
    assert min(norms[0]) > 0.5, norms  # clipping at least halved each step
    for other in finals[1:]:
        for a, b in zip(finals[0], other):
            assert torch.equal(a, b)


def test_buffer_modes_that_cannot_hold_are_refused(shards):
    """broadcast needs bsp rounds (rank 0 in every round): the shards refuse
    its layout; a non-finite persistent buffer (a -inf mask) could never be
    pushed: both refused at construction, by name."""
    addrs = shards(1, 1, "--optimizer=adam", "--pull_codec=fp32",
                   "--consistency=async")
    net = BNNet()
    with pytest.raises(pserver.Error, match=r"\('bn.running_mean'\) is a "
                       "broadcast buffer; the shard's --consistency is not "
                       "bsp") as refused:
        make(net.parameters(), addrs, module=net, buffers="broadcast")
    assert refused.value.code == "FAILED_PRECONDITION"
    masked = BNNet()
    masked.register_buffer("mask", torch.tensor([0.0, -float("inf")]))
    with pytest.raises(ValueError, match="buffer 'mask' holds a non-finite "
                       "value"):
        make(masked.parameters(), addrs, module=masked)


def test_local_steps_with_bf16_push_no_rounding_as_a_move(shards):
    """With local steps, a bf16 model that did not move pushes a zero weight
    change: once a real move has taken the fp32 master off the bf16 grid,
    synchronisations without a local change leave it where it is instead of
    pulling it onto the grid."""
    # An outer lr of 0.5 takes the master off the bf16 grid.
    addrs = shards(1, 1, "--optimizer=sgd", "--lr=0.5", "--momentum=0",
                   "--pull_codec=fp32")
    torch.manual_seed(5)
    net = torch.nn.Linear(16, 16).to(torch.bfloat16)
    inner = torch.optim.SGD(net.parameters(), lr=0.01)
    opt = make(net.parameters(), addrs, local_steps=2, inner_optimizer=inner)
    for _ in range(2):  # a real move: the master is off the grid now
        for p in net.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    moved = torch.empty(opt.client.num_params)
    opt.client.copy_weights_into(moved)
    assert not torch.equal(moved, moved.to(torch.bfloat16).float())
    inner.param_groups[0]["lr"] = 0.0
    for _ in range(4):  # two synchronisations without a local change
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
    after = torch.empty_like(moved)
    opt.client.copy_weights_into(after)
    assert opt.client.global_step == 3
    assert torch.equal(after, moved)


class MaskNet(torch.nn.Module):
    """A causal mask registered as nanoGPT does without flash attention:
    persistent, constant, larger than the model."""

    def __init__(self, persistent):
        super().__init__()
        torch.manual_seed(6)
        self.fc = torch.nn.Linear(8, 8)
        self.register_buffer("mask", torch.tril(torch.ones(64, 64)),
                             persistent=persistent)

    def forward(self, x):
        return (self.fc(x) @ self.mask[:8, :8]).sum()


def test_a_buffer_that_did_not_change_is_not_sent_again(shards):
    """1-bit pushes and pulls: a constant persistent mask of 4096 elements
    costs no payload per step once registered (pushed and pulled as
    CODEC_UNCHANGED), against the same model without it in the layout;
    changed by the script on every worker, it travels once and every worker
    holds the new mask, and the parameters train exactly as without it."""
    runs = {}
    for persistent in (True, False):
        addrs = shards(2, 2, *ONEBIT)
        nets = [MaskNet(persistent), MaskNet(persistent)]
        opts = [None, None]

        def construct(r):
            opts[r] = make(nets[r].parameters(), addrs, rank=r, world=2,
                           module=nets[r], push_codec="onebit")

        in_threads(lambda: construct(1), lambda: construct(0))
        start = [o.stats() for o in opts]
        bytes_at = []

        def work(r, step):
            if step == 4:  # the script changes its mask (every worker)
                nets[r].mask[0, 1] = 0.5
            g = torch.Generator().manual_seed(10 * step + r)
            nets[r](torch.randn(4, 8, generator=g)).backward()
            opts[r].step()
            opts[r].zero_grad()

        for step in range(8):
            in_threads(lambda: work(0, step), lambda: work(1, step))
            bytes_at.append(sum(
                o.stats()["push_payload_bytes"] + o.stats()[
                    "pull_payload_bytes"] - s["push_payload_bytes"] -
                s["pull_payload_bytes"] for o, s in zip(opts, start)))
        runs[persistent] = bytes_at, nets
    with_mask, nets = runs[True]
    without, plain = runs[False]
    mask_bytes = 4096 * 4
    # Steps 0-3 and 5-7: the same bytes as without the mask in the layout.
    assert with_mask[3] == without[3], (with_mask, without)
    # Step 4: the changed mask once each way per worker (two workers, the
    # pull delta as fp32 of the change), nothing after.
    extra = (with_mask[4] - with_mask[3]) - (without[4] - without[3])
    assert 0 < extra <= 2 * 2 * mask_bytes, extra
    assert (with_mask[7] - with_mask[4]) == (without[7] - without[4])
    for n in nets:
        assert n.mask[0, 1] == 0.5 and n.mask[0, 2] == 0
        torch.testing.assert_close(n.mask, nets[0].mask, rtol=0, atol=0)
    for a, b in zip(nets[0].parameters(), plain[0].parameters()):
        assert torch.equal(a, b)
