"""DistributedOptimizer.state_dict() / load_state_dict() against real shards:
a worker killed mid-run and restarted continues as if it never stopped."""

import io
import os
import pathlib
import signal
import subprocess
import sys
import threading

import pytest
import torch

import pserver
import pserver.torch
import state_worker  # python/tests/, on sys.path under pytest

HERE = pathlib.Path(__file__).resolve().parent
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])

# 1-bit Adam: 3 warmup steps with fp32 pushes, then 1-bit pushes whose
# error-feedback residuals are what a restart would lose.
FLAGS = ("--optimizer=onebit_adam", "--lr=0.01", "--freeze_step=3",
         "--bias_correction=true")
KILLED_AT, LAST = 7, 12



def record_of(state_dict):
    """The client's record in a state_dict() as bytes."""
    return state_dict["pserver_client_state"].numpy().tobytes()

def params(net):
    return [p.detach().clone() for p in net.parameters()]


def run_restarted(addrs, tmp_path, load):
    """A worker process trains to KILLED_AT and dies by SIGKILL; a new
    worker (here) registers, loads its state_dict if `load`, trains to LAST.
    Returns (final parameters, the dead worker's residual norm, the new
    worker's residual norm after register and after load)."""
    out = tmp_path / "killed.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [sys.executable, str(HERE / "state_worker.py"), ",".join(addrs),
         str(out), str(KILLED_AT)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stdout.decode()
    saved = torch.load(out)
    net = state_worker.model()
    with torch.no_grad():  # the restarted process's own init: overwritten
        for q in net.parameters():
            q.add_(1.0)
    opt = state_worker.optimizer(net, addrs)
    assert opt.global_step == KILLED_AT
    after_register = opt.client.residual_norm
    if load:
        opt.load_state_dict(saved["state"])
    after_load = opt.client.residual_norm
    state_worker.train_until(net, opt, LAST)
    return params(net), saved["residual_norm"], after_register, after_load


def test_killed_worker_restarted_with_state_dict_ends_identical(shards,
                                                               tmp_path):
    torch.set_num_threads(1)
    # The uninterrupted run.
    net = state_worker.model()
    opt = state_worker.optimizer(net, shards(2, 1, *FLAGS))
    state_worker.train_until(net, opt, LAST)
    uninterrupted = params(net)
    assert opt.client.stage == "OPTIMIZER_STAGE_COMPRESSION"
    del opt

    final, saved_norm, registered_norm, loaded_norm = run_restarted(
        shards(2, 1, *FLAGS), tmp_path, load=True)
    assert saved_norm > 0
    assert registered_norm == 0.0  # a new Client starts without residuals
    # The loaded residual's norm is a pass in double, the saved one summed
    # by the 1-bit kernel in float lanes: equal to ~1e-7 (the residuals
    # themselves show bit for bit in the final weights below).
    assert loaded_norm == pytest.approx(saved_norm, rel=1e-6)
    for a, b in zip(final, uninterrupted):
        assert torch.equal(a, b)

    # The control: the same restart without load_state_dict loses the
    # residuals and ends elsewhere (so the comparison above can fail).
    final, _, _, loaded_norm = run_restarted(shards(2, 1, *FLAGS), tmp_path,
                                             load=False)
    assert loaded_norm == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(final, uninterrupted))


class Net(torch.nn.Module):
    def __init__(self, transposed=False):
        super().__init__()
        torch.manual_seed(3)
        shape = (4, 6) if transposed else (6, 4)  # 24 elements either way
        self.w1 = torch.nn.Parameter(torch.randn(*shape))
        self.w2 = torch.nn.Parameter(torch.randn(3, 6))

    def forward(self, x):
        return torch.tanh(x @ self.w1.reshape(6, 4).t()) @ self.w2.t()


def test_state_of_another_worker_or_model_is_refused_and_changes_nothing(
        shards, capfd):
    addrs = shards(2, 2, "--optimizer=adam", "--lr=0.01")
    nets = [Net(), Net()]
    opts = [pserver.torch.DistributedOptimizer(
        n.named_parameters(), servers=addrs, worker_id=r, num_workers=2,
        push_codec="onebit", retry_budget=20) for r, n in enumerate(nets)]
    for step in range(2):
        threads = []
        for r, (n, o) in enumerate(zip(nets, opts)):
            n(torch.randn(5, 4, generator=torch.Generator().manual_seed(
                10 * step + r))).square().sum().backward()
            threads.append(threading.Thread(target=o.step))
            threads[-1].start()
        for t in threads:
            t.join(60)
            assert not t.is_alive()
    assert opts[1].global_step == 2
    mine = opts[1].state_dict()
    assert opts[1].client.residual_norm > 0
    # Round trip through torch.save/torch.load.
    buf = io.BytesIO()
    torch.save(opts[0].state_dict(), buf)
    buf.seek(0)
    other_worker = torch.load(buf)
    assert other_worker["worker_id"] == 0 and other_worker["global_step"] == 2

    def same(a, b):
        """state_dict()s equal, the shards' state and the record compared
        by their bytes."""
        strip = ("pserver_shards", "pserver_client_state")
        if {k: v for k, v in a.items() if k not in strip} != {
                k: v for k, v in b.items() if k not in strip}:
            return False
        if record_of(a) != record_of(b):
            return False
        return [(s["step"], s["replica_checksum"], s["state"].tolist())
                for s in a["pserver_shards"]] == [
                    (s["step"], s["replica_checksum"], s["state"].tolist())
                    for s in b["pserver_shards"]]

    def unchanged():
        assert same(opts[1].state_dict(), mine)

    # Issue 47: another worker's state_dict (every rank of a resume loading
    # rank 0's file) is taken: the shards hold its step already, and worker
    # 1 keeps its own residuals, with one line saying so.
    residual = opts[1].client.residual_norm
    # The record alone still says whose it is, to its last word.
    with pytest.raises(pserver.Error, match=r"is for worker 0/2 .* this is "
                       r"worker 1/2 with 2 shards and \d+ parameters$"):
        opts[1].client.restore_state(record_of(other_worker))
    capfd.readouterr()
    opts[1].load_state_dict(other_worker)
    assert opts[1].client.residual_norm == residual
    assert ("pserver: this state_dict is worker 0's; worker 1 takes the "
            "shards' optimizer state from it, not worker 0's error-feedback "
            "residuals" in capfd.readouterr().err)
    unchanged()

    # Worker 0 of another 2-worker job on 2 shards with a model of the same
    # size: the client's record alone (ids, sizes, ranges) would fit
    # opts[0]; the layout says it is another model.
    other = pserver.torch.DistributedOptimizer(
        Net(transposed=True).named_parameters(),
        servers=shards(2, 2, "--optimizer=adam"), worker_id=0, num_workers=2,
        push_codec="onebit")
    foreign = other.state_dict()
    before = opts[0].state_dict()
    with pytest.raises(ValueError, match=r"layout\[0\] is 'w1' with shape "
                       r"\[4, 6\]; expected 'w1' with shape \[6, 4\]"):
        opts[0].load_state_dict(foreign)
    assert same(opts[0].state_dict(), before)
    opts[0].client.restore_state(record_of(foreign))  # fits

    # The record is a uint8 tensor (torch.save stores it as raw bytes).
    assert mine["pserver_client_state"].dtype == torch.uint8
    damaged = bytearray(record_of(mine))
    damaged[len(damaged) // 2] ^= 1
    with pytest.raises(pserver.Error, match="state_dict") as e:
        opts[1].load_state_dict(dict(mine, pserver_client_state=bytes(
            damaged)))
    assert e.value.code == "DATA_LOSS"
    unchanged()
    for bad in ({}, [], {"pserver_client_state": "text"},
                {"pserver_client_state": torch.zeros(4)},
                dict(mine, layout=[("w1",)]), dict(mine, layout=7)):
        with pytest.raises(ValueError, match="expected"):
            opts[1].load_state_dict(bad)
    unchanged()
    opts[1].load_state_dict(mine)
    unchanged()
    # A bare record (e.g. a pserver_worker --state_file read as bytes, as
    # the earlier versions' state_dict held it).
    opts[1].load_state_dict({"pserver_client_state": record_of(mine)})
    unchanged()
