"""One push per machine (python3 -m pserver.launch --push-per node, issue
48): real launchers (two "machines" on loopback for --nnodes 2), real
shards, real worker processes (node_worker.py). The machine's workers
average inside it and local rank 0 pushes; the result is the flat run's
(every worker pushing) to rounding in fp32, the machine's link carries one
push instead of G, and what the others do mirrors local rank 0."""

import os
import subprocess
import sys

import pytest
import torch

from test_launch import HERE, PACKAGE_ROOT, no_process_left
from test_launch_nodes import free_port, texts
from conftest import server_binary

NODE_WORKER = str(HERE / "node_worker.py")


def launch(tmp_path, name, mode, steps, *flags, nnodes=1, per_node=2,
           push="node"):
    """Runs the job on `nnodes` launchers (each `per_node` workers and one
    shard; one launcher with 2 shards when nnodes is 1); returns
    (exit codes, outputs, {rank: what node_worker.py saved})."""
    out = tmp_path / name
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, str(HERE), os.environ.get("PYTHONPATH", "")]))
    port = free_port()
    procs = []
    for r in range(nnodes):
        where = (["--workers", str(per_node)] if nnodes == 1 else
                 ["--nnodes", str(nnodes), "--node-rank", str(r),
                  "--nproc-per-node", str(per_node),
                  "--rdzv-endpoint", f"127.0.0.1:{port}"])
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pserver.launch", "--server-bin",
             server_binary(), "--run-dir", str(out / f"run{r}"), *where,
             "--push-per", push, *flags, NODE_WORKER, str(out), str(steps),
             mode], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT))
    outputs = texts(*procs)
    for r in range(nnodes):
        if (out / f"run{r}" / "pids").exists():
            no_process_left(out / f"run{r}")
    saved = {}
    for r in range(nnodes * per_node):
        path = out / f"rank{r}.pt"
        if path.exists():
            saved[r] = torch.load(path)
    return [p.returncode for p in procs], outputs, saved


def ok(result):
    codes, outputs, saved = result
    assert codes == [0] * len(codes), "\n".join(outputs)
    return saved


def machine_bytes(saved, per_node, key):
    """The push (or pull) payload bytes of each machine's workers."""
    n = len(saved) // per_node
    return [sum(saved[m * per_node + i]["stats"][key]
                for i in range(per_node)) for m in range(n)]


# Linear in the gradient, so rounding stays rounding (Adam's m / sqrt(v)
# turns a rounding-sized change of a near-zero gradient into a step of lr).
SGD = ["--optimizer", "sgd", "--momentum=0.9"]


@pytest.mark.parametrize("mode,flags", [
    ("sgd", SGD), ("broadcast_clip", SGD), ("branch", SGD),
    ("local", ["--optimizer", "sgd", "--momentum=0.9", "--nesterov=true"])])
def test_one_push_per_machine_is_the_flat_runs_mean(tmp_path, mode, flags):
    """2 machines x 2 workers, fp32: every rank ends with the flat run's
    weights and buffers to rounding (the shards' mean over 2 machine means
    is the mean over 4 workers), and each machine pushes and pulls half
    the flat run's bytes: local rank 0's, the other's nothing."""
    node = ok(launch(tmp_path, "node", mode, 12, *flags, nnodes=2))
    flat = ok(launch(tmp_path, "flat", mode, 12, *flags, nnodes=2,
                     push="worker"))
    start = flat[0]["start"]  # rank 0's model, which every rank took
    moved = (flat[0]["flat"][:len(start)] - start).abs().max()
    assert moved > 0.005, moved
    for r in range(4):
        # What a script shards its data by stays the process's rank.
        assert (node[r]["init"]["worker_id"], node[r]["init"]["num_workers"],
                node[r]["init"]["node_group"]["node"]) == (r, 4, r // 2)
        assert node[r]["step"] == flat[r]["step"] == 12
        assert torch.equal(node[r]["flat"], node[0]["flat"]), r
        # Rounding: a few float32 ulps of each value.
        assert torch.allclose(node[r]["flat"], flat[r]["flat"], rtol=2e-6,
                              atol=1e-5 * float(moved)), (
            (node[r]["flat"] - flat[r]["flat"]).abs().max())
    for key in ("push_payload_bytes", "pull_payload_bytes"):
        per_machine = machine_bytes(node, 2, key)
        half = [b / 2 for b in machine_bytes(flat, 2, key)]
        # Broadcast buffers: a flat run's other ranks push zeros there,
        # which encode smaller than values; a tensor without a gradient
        # is not sent, and a machine sends it if any of its workers has one.
        slack = 0.01 if mode in ("broadcast_clip", "branch") else 0.0
        assert all(abs(n - h) <= slack * h
                   for n, h in zip(per_machine, half)), (per_machine, half)
        assert node[1]["stats"][key] == node[3]["stats"][key] == 0
    assert node[1]["stats"]["steps"] == flat[1]["stats"]["steps"]


def test_one_bit_with_one_push_per_machine_stays_within_the_codecs_error(
        tmp_path):
    """1-bit Adam (frozen at round 4): one push per machine is not the flat
    run (one error feedback per machine, not per worker), but no farther
    from it than the flat 1-bit run is from fp32 Adam's."""
    onebit = ["--optimizer", "onebit_adam", "--freeze_step=4"]
    node = ok(launch(tmp_path, "node", "sgd", 16, *onebit, nnodes=2))
    flat = ok(launch(tmp_path, "flat", "sgd", 16, *onebit, nnodes=2,
                     push="worker"))
    fp32 = ok(launch(tmp_path, "fp32", "sgd", 16, "--optimizer", "adam",
                     nnodes=2, push="worker"))
    codec_error = (flat[0]["flat"] - fp32[0]["flat"]).norm()
    assert codec_error > 0
    assert (node[0]["flat"] - flat[0]["flat"]).norm() <= codec_error
    assert machine_bytes(node, 2, "push_payload_bytes") == [
        b // 2 for b in machine_bytes(flat, 2, "push_payload_bytes")]


def test_an_overflow_on_one_worker_skips_the_round_for_the_machine(
        tmp_path):
    """GradScaler: rank 1 (not the one that pushes) finds an inf at step 3;
    the machine's push says so, the round is skipped for every worker, and
    both scalers see it and back off alike."""
    saved = ok(launch(tmp_path, "node", "overflow", 6, "--optimizer",
                      "adam"))
    for r in (0, 1):
        assert saved[r]["skipped"] == [False] * 3 + [True] + [False] * 2
        assert saved[r]["step"] == 6  # a skipped round is a round
        assert saved[r]["scale"] == saved[0]["scale"] < 2.0 ** 8
    assert torch.equal(saved[0]["flat"], saved[1]["flat"])


def test_rank_0s_checkpoint_resumes_every_rank(tmp_path):
    """The common script's pattern: rank 0 saves state_dict() mid-run and
    every rank loads that file; both machines' workers go on as the flat
    run does."""
    node = ok(launch(tmp_path, "node", "resume", 10, *SGD, nnodes=2))
    flat = ok(launch(tmp_path, "flat", "resume", 10, *SGD, nnodes=2,
                     push="worker"))
    for r in range(4):
        assert node[r]["step"] == 10
        assert torch.allclose(node[r]["flat"], flat[r]["flat"], rtol=0,
                              atol=1e-5)


def test_a_refusal_on_local_rank_0_is_raised_on_every_worker(tmp_path):
    """rank 1 (which never contacts a shard) gives a NaN gradient: the
    machine's mean is refused on local rank 0, and rank 1 raises the same
    pserver.Error, code included, naming local rank 0."""
    saved = ok(launch(tmp_path, "node", "nan", 5, *SGD))
    lead, other = saved[0]["error"], saved[1]["error"]
    assert lead is not None and lead["type"] == "Error", lead
    assert other == {"type": "Error", "code": lead["code"],
                     "message": "this machine's pushing worker (local rank "
                     f"0) failed: {lead['message']}"}, other
    assert saved[0]["step"] == saved[1]["step"] == 2


@pytest.mark.parametrize("mode,rank,message", [
    ("overlap", 0, "ValueError: overlap=True pushes each gradient as "
     "backward produces it; with one push per machine (--push-per node) "
     "the machine's mean is pushed after backward: use overlap=False"),
    ("follower_saves", 1, "RuntimeError: DistributedOptimizer.state_dict(): "
     "with one push per machine (--push-per node) the optimizer's state is "
     "local rank 0's")])
def test_what_one_push_per_machine_cannot_serve_is_refused(
        tmp_path, mode, rank, message):
    codes, outputs, _ = launch(tmp_path, "node", mode, 3, "--optimizer",
                               "adam")
    assert codes == [1], outputs
    seen = outputs[0] if rank == 0 else (
        tmp_path / "node" / "run0" / f"worker{rank}.log").read_text()
    assert message in seen, seen


def test_a_bad_push_per_exits_2_with_one_line(tmp_path):
    codes, outputs, _ = launch(tmp_path, "bad", "sgd", 1, push="machine")
    assert codes == [2]
    assert outputs[0] == ("launch: error: --push-per is 'machine'; expected "
                          "worker (each worker pushes) or node (one push "
                          "per machine)\n"), outputs[0]


@pytest.mark.parametrize("consistency", [
    ["--consistency=ssp", "--max_staleness=2"], ["--consistency=async"]])
def test_relaxed_consistency_with_one_push_per_machine(tmp_path,
                                                       consistency):
    """ssp and async rounds: the machine is the shards' worker, so each
    machine's ranks end with the same weights and step, local rank 0's."""
    saved = ok(launch(tmp_path, "node", "sgd", 8, *SGD, *consistency,
                      nnodes=2))
    for m in (0, 1):
        lead, other = saved[2 * m], saved[2 * m + 1]
        assert torch.equal(lead["flat"], other["flat"]), m
        assert lead["step"] == other["step"] >= 8


def test_the_machines_store_keeps_no_record_of_past_steps():
    """A step's outcome rides in the header local rank 0 broadcasts; only
    an error or Register's settings go through the machine's store, so a
    long run does not grow the launcher's store."""
    import datetime
    import torch.distributed as dist
    from pserver import _node
    store = dist.TCPStore("127.0.0.1", 0, None, True,
                          wait_for_workers=False)
    group = _node.NodeGroup({"host": "127.0.0.1", "port": store.port,
                             "node": 0, "nodes": 1, "local_rank": 0,
                             "local_size": 1})
    for _ in range(20):
        group.lead(lambda: 1, numbers=lambda r: (0.0, float(r)))
    group.lead(lambda: 1, share=lambda r: {"x": r})  # call 21, kept
    store.set_timeout(datetime.timedelta(seconds=1))
    assert store.get("pserver/node/call21") == b'{"x": 1}'
    for k in (1, 20):
        with pytest.raises(RuntimeError):  # torch: a timeout, no such key
            store.get(f"pserver/node/call{k}")
